"""submit_run: admission, then the run row and its billing hold in one transaction, then the first wake-up."""

from __future__ import annotations

import structlog

from checkpoints import runs
from checkpoints.db import in_txn
from fencing import admission, events
from tasks import queues

log = structlog.get_logger("tasks.submit")

# The queues first wake-ups wait in: what the global admission limit counts.
ADMISSION_QUEUES = (queues.NORMAL, queues.LARGE)


def submit_run(user_id: str, query: str, kind: str = "normal") -> str:
    """Create a run and wake it; returns the run id (= the Celery task id of its first message).

    Raises AdmissionRefused (a limit; see `retry_after_s`), InsufficientCredits or InvalidRequest, and
    then nothing was written. If the process dies between the commit and the send, the sweeper sends
    the wake-up."""
    from tasks.app import run_agent

    run_id = runs.new_run_id()
    admission.admit(run_id, user_id, ADMISSION_QUEUES)
    try:
        credits = in_txn(runs.create_run_txn, run_id, user_id, kind, query, "api")
    except BaseException:
        admission.release_slot(user_id, run_id)  # no run: the slot goes back
        raise
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
    finally:
        # The message now counts in the queue's list (or the sweeper owns the send): not unsent any more.
        admission.mark_sent(run_id)
    return run_id
