"""The run_agent task of the Celery app (`celery -A tasks worker`), its worker signals and bootstep.

The app object itself is tasks.celery_app's; wake-ups go out through tasks.wakeup."""

from __future__ import annotations

from typing import Any

import structlog
from billiard.exceptions import WorkerLostError
from celery import Task, signals
from celery.concurrency import asynpool
from celery.worker.request import Request

from tasks import wakeup
from tasks.bootsteps import LivenessStep, NoMingleStep, SlotsStep
from tasks.celery_app import RUN_TASK, app
from tasks.delivery import deliver, stop_inlining
from tasks.metrics import MetricsStep
from tasks.routing_worker import RoutingStep

log = structlog.get_logger("tasks.app")
# Kept for callers of the old names: both are the one sender's (tasks.wakeup).
send_continuation = wakeup.continuation
send_rescue = wakeup.rescue


class RunRequest(Request):
    """run_agent's request in the worker: a prefork child that dies mid-step is taken over at once."""

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> None:
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        from fenced_core.settings import get_settings

        # billiard hands the parent an ExceptionWithTraceback that wraps the WorkerLostError (in .exc)
        lost = getattr(exc_info.exception, "exc", exc_info.exception)
        if not isinstance(lost, WorkerLostError) or not get_settings().fast_takeover:
            return
        from fencing.liveness import child_died

        run_id, pid = self.args[0], self.worker_pid
        try:
            if pid and child_died(run_id, pid, wakeup.rescue):
                log.warning("child_died_rescued", run_id=run_id, pid=pid)
        except Exception as exc:  # Redis or the broker down: the lease still expires; the reaper rescues then
            log.warning("child_died_rescue_failed", run_id=run_id, error=repr(exc))


class RunEnded(Exception):
    """The delivery ended its run failed or dead: raised so Celery (and Flower) mark this task FAILURE.

    Listed in the task's `throws`, so Celery logs it in one line without a traceback, and never
    retried: the message is acked (late acks ack a failure) and the run row already says how it ended."""


# Celery's prefork parent reaps a dead child on its process-exit handler, but when the child's sentinel
# fires before waitpid can reap it, only the pool's maintenance timer (every 5 s) finds it: the pool
# child takeover then took 1.8-4.6 s instead of well under one. The timer runs every 0.25 s instead
# (a walk over the pool's few processes). Celery has no setting for it, so the property is replaced.
MAINTAIN_POOL_S = 0.25
asynpool.AsynPool.timers = property(lambda self: {self.maintain_pool: MAINTAIN_POOL_S})


@app.task(name=RUN_TASK, bind=True, acks_late=True, ignore_result=True, Request=RunRequest,
          throws=(RunEnded,))
def run_agent(self: Task, run_id: str, step: int | None = None) -> str:
    """Wake a run up: the run row decides what happens (see tasks.delivery and docs/design.md).

    Send it as often as you like (`run_agent.delay(run_id)`): a wake-up for a run someone holds, or for a
    step already done, does nothing. Acked late: a worker that crashes mid-step leaves the run to be taken
    over from its last checkpoint (lease expiry, fast takeover, or this message redelivered), and a
    holder taken over is fenced out of every write it still tries."""
    outcome = deliver(run_id, step, send_next=wakeup.continuation, inline=_inline_steps())
    if outcome in ("failed", "dead"):
        raise RunEnded(f"run {run_id} ended {outcome} in this delivery (see `fenced status {run_id}`)")
    return outcome


def _inline_steps() -> int:
    from fenced_core.settings import get_settings

    return get_settings().inline_steps


@signals.worker_process_init.connect
def _no_inlining_in_pool_children(**_: Any) -> None:
    """A prefork child never hears of its worker's drain: its deliveries hand every step over."""
    stop_inlining()


@signals.celeryd_after_setup.connect
def _name_the_node(sender: str = "", **_: Any) -> None:
    """Remember this worker's node name (`w2@host`): the ledger names claims by it (pool children inherit)."""
    import os

    os.environ["FENCED_NODE_NAME"] = str(sender)


@signals.worker_init.connect
def _on_worker_init(**_: Any) -> None:
    from checkpoints.db import migrate
    from fenced_core.settings import get_settings

    s = get_settings()
    _migrate_or_refuse(migrate)
    _refuse_if_epochs_behind()
    if s.lease_ttl_ms < 3 * s.heartbeat_ms:
        log.warning("lease_under_three_heartbeats", lease_ttl_ms=s.lease_ttl_ms, heartbeat_ms=s.heartbeat_ms)
    log.info("worker_init", lease_ttl_ms=s.lease_ttl_ms, heartbeat_ms=s.heartbeat_ms,
             reaper_tick_ms=s.reaper_tick_ms, sweeper_interval_ms=s.sweeper_interval_ms)


def _migrate_or_refuse(migrate: Any) -> None:
    """Bring the schema to head; a store that refuses the connection's settings (a wrong user, password
    or database name: nothing a retry can fix) stops the worker before it consumes anything, in one line.
    A store that is down is not refused: the worker rides the outage out like any other."""
    from checkpoints.db import is_config_error, refused_message

    try:
        migrate()
    except Exception as exc:
        if not is_config_error(exc):
            raise
        log.error("run_store_refused", error=repr(getattr(exc, "orig", exc)))
        raise SystemExit(f"fenced worker refuses to start: {refused_message(exc)}") from None


def _refuse_if_epochs_behind() -> None:
    """A database that lost commits (its epochs behind the Redis mirrors) stops the worker before it
    consumes anything: SystemExit, which Celery's signal dispatch does not swallow (tasks.epoch_check)."""
    from tasks.epoch_check import EpochsBehind, ensure_epochs_not_behind

    try:
        checked = ensure_epochs_not_behind()
    except EpochsBehind as exc:
        log.error("epochs_behind", runs=[b.run_id for b in exc.behind], checked=exc.checked)
        raise SystemExit(f"fenced worker refuses to start: {exc}") from None
    except Exception as exc:  # a store down at start-up: the worker rides it out like any outage
        log.warning("epoch_check_skipped", error=repr(exc))
        return
    log.info("epoch_check_passed", runs_checked=checked)


@signals.worker_shutting_down.connect
def _bound_the_drain(sig: str = "", how: str = "", **_: Any) -> None:
    """SIGTERM: Celery stops consuming and lets steps in flight finish; we bound that by drain_s.

    A step still running after drain_s dies with the worker; its lease expires and another worker
    takes the run over from its last checkpoint, so an overrun is taken over, never dropped."""
    import multiprocessing
    import os
    import threading

    from fenced_core.pools import off_the_hub
    from fenced_core.settings import get_settings

    drain_s = get_settings().drain_s

    def give_up() -> None:
        log.warning("drain_overrun", drain_s=drain_s, how=how)
        for child in multiprocessing.active_children():
            child.kill()
        os._exit(1)

    stop_inlining()  # deliveries in flight end at their current step (threads and gevent pools)

    def start_the_clock() -> None:
        log.info("draining", signal=sig, how=how, drain_s=drain_s)
        timer = threading.Timer(drain_s, give_up)
        timer.daemon = True
        timer.start()

    off_the_hub(start_the_clock)


app.steps["worker"].add(LivenessStep)
app.steps["worker"].add(SlotsStep)  # the pool size, for the inline-step rule (tasks.delivery)
app.steps["worker"].add(NoMingleStep)  # no 1 s hello at start-up: fenced never revokes
app.steps["worker"].add(MetricsStep)  # /metrics on FENCED_METRICS_PORT (off by default)
app.steps["worker"].add(RoutingStep)  # the worker registry and routing (routing/, docs/routing.md)
