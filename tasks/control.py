"""What people do to runs (cancel, reply, replay a dead letter): the database first, then Redis and the wake-up."""

from __future__ import annotations

import structlog

from checkpoints import inputs, lifecycle
from checkpoints.lifecycle import Cancelled
from fencing import admission, events, keys
from fencing.connection import get_redis
from fencing.epoch import raise_epoch
from tasks import queues
from tasks.app import send_wakeup

log = structlog.get_logger("tasks.control")


def cancel_run(run_id: str, by: str) -> Cancelled:
    """Cancel a run; a running step stops at its next boundary and is fenced out of every later write."""
    result = lifecycle.cancel(run_id, by)
    if result.noop:
        return result
    try:
        # Raise the mirror first: from here on the old holder's events are refused too.
        raise_epoch(run_id, result.epoch)
        events.append(run_id, result.epoch, "run:cancelled", "run_cancelled", -1,
                      {"by": by, "previous_state": result.previous_state, "credits_charged": result.credits_charged})
        # The holder's watchdog sees its lease gone and stops at the next boundary.
        get_redis().delete(keys.lease(run_id))
        admission.release_slot(result.user_id, run_id)  # a cancelled run no longer counts for its user
    except Exception as exc:  # the database already fences the holder; Redis is best effort
        log.warning("cancel_redis_failed", run_id=run_id, epoch=result.epoch, error=repr(exc))
    log.info("cancelled", run_id=run_id, epoch=result.epoch, by=by, previous_state=result.previous_state)
    return result


def reply_to_run(run_id: str, text: str, by: str) -> inputs.Input:
    """Store a person's reply (the run goes back to queued in the same transaction), then wake the run."""
    step, answered = inputs.reply(run_id, text, by)
    _wake(run_id, step)
    return answered


def replay_dead_letter(run_id: str, by: str) -> int:
    """Replay a dead run from its last checkpoint with a fresh delivery budget; returns its step."""
    step = lifecycle.replay(run_id, by)
    _wake(run_id, step)
    return step


def _wake(run_id: str, step: int) -> None:
    try:
        send_wakeup(run_id, step, queues.CONTINUE)
    except Exception as exc:  # committed is committed: the sweeper sends the wake-up
        log.warning("wakeup_send_failed", run_id=run_id, error=repr(exc))
