"""The one wake-up sender: every message that wakes a run goes out through `send` (routing plugs in here).

A wake-up carries the run id and the step it wakes (None: whatever step the run is at), nothing the
run depends on; any number of copies may arrive and the run row decides what each does. Who sends:
submit (the first wake-up, on the kind's queue, with the run id as its task id), a finished step's
continuation, a rescue (reaper, sweeper, fast takeover), a reply to a waiting run, a dead letter's
replay; those four go on the continuation queue, consumed first."""

from __future__ import annotations

from typing import Any, Literal

import structlog
from celery import Celery

from tasks import queues
from tasks.celery_app import RUN_TASK
from tasks.celery_app import app as _default_app

log = structlog.get_logger("tasks.wakeup")

Reason = Literal["submit", "continuation", "rescue", "reply", "replay"]
REASONS: tuple[Reason, ...] = ("submit", "continuation", "rescue", "reply", "replay")
_app: list[Celery] = [_default_app]


def use_app(app: Celery) -> None:
    """Send through `app` from now on (an installed user app with its own broker settings)."""
    _app[0] = app


def queue_for(reason: Reason, kind: str = "normal") -> str:
    """The queue a wake-up goes to: a first wake-up waits with its kind, every other one goes first."""
    return queues.for_kind(kind) if reason == "submit" else queues.CONTINUE


def send(run_id: str, step: int | None, reason: Reason, *, kind: str = "normal") -> None:
    """Send one wake-up for `run_id` at `step`. Raises what the broker raises (kombu's errors): the
    caller has committed what the wake-up is for, so a lost send is the sweeper's to repeat, never a
    reason to undo the commit. After a crash mid-send either the message exists or the sweeper sends it."""
    if reason not in REASONS:
        raise ValueError(f"unknown wake-up reason {reason!r}; known: {', '.join(REASONS)}")
    queue = queue_for(reason, kind)
    options: dict[str, Any] = {"task_id": run_id} if reason == "submit" else {}
    _app[0].send_task(RUN_TASK, args=(run_id, step), queue=queue, routing_key=queue, **options)
    log.debug("wakeup_sent", run_id=run_id, step=step, reason=reason, queue=queue)


def continuation(run_id: str, step: int) -> None:
    """The next step's wake-up, sent after the finished step let go of (or handed over) its lease."""
    send(run_id, step, "continuation")


def rescue(run_id: str) -> None:
    """A rescue: wake the run at whatever step it is (reaper, sweeper, fast takeover)."""
    send(run_id, None, "rescue")


def promoted(run_id: str, from_queue: str, to_queue: str) -> None:
    """A waiting first wake-up was moved ahead (fencing.fairness, atomically in Redis; the message is
    the same, so nothing is sent again): said here so routing sees every wake-up's way to a worker."""
    log.info("wakeup_promoted", run_id=run_id, from_queue=from_queue, to_queue=to_queue)
