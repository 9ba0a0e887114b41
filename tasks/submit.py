"""submit_run: the run row and its billing hold in one transaction, then the first wake-up."""

from __future__ import annotations

import structlog

from checkpoints import runs
from checkpoints.db import in_txn
from fencing import events
from tasks import queues

log = structlog.get_logger("tasks.submit")


def submit_run(user_id: str, query: str, kind: str = "normal") -> str:
    """Create a run and wake it; returns the run id (= the Celery task id of its first message).

    If the process dies between the commit and the send, the sweeper sends the wake-up."""
    from tasks.app import run_agent

    run_id = runs.new_run_id()
    credits = in_txn(runs.create_run_txn, run_id, user_id, kind, query, "api")
    try:
        events.append(run_id, 0, "run:queued", "run_queued", 0, {"kind": kind, "credits_held": credits})
    except Exception as exc:  # the stream is best effort; the row is the truth
        log.warning("queued_event_failed", run_id=run_id, epoch=0, error=repr(exc))
    try:
        run_agent.apply_async(args=(run_id, None), task_id=run_id, queue=queues.for_kind(kind),
                              routing_key=queues.for_kind(kind))
    except Exception as exc:  # committed is committed: the sweeper sends the wake-up; never lose the id
        log.error("wakeup_send_failed", run_id=run_id, epoch=0, error=repr(exc))
    else:
        log.info("submitted", run_id=run_id, epoch=0, kind=kind, credits_held=credits)
    return run_id
