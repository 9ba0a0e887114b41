"""What people do to runs (cancel, reply, replay a dead letter): the database first, then Redis and the wake-up."""

from __future__ import annotations

import structlog

from checkpoints import inputs, lifecycle, runs
from checkpoints.lifecycle import Cancelled
from fenced_core.errors import InvalidRequest, RunNotFound, StoreUnavailable
from fencing import admission
from fencing.epoch import raise_epoch
from tasks import endings, wakeup
from tasks.submit import ADMISSION_QUEUES

log = structlog.get_logger("tasks.control")


def cancel_run(run_id: str, by: str, user_id: str | None = None) -> Cancelled:
    """Cancel a run; a running step stops at its next boundary and is fenced out of every later write.

    `user_id`: the run must be this user's (InvalidRequest otherwise, nothing written); None = operator.
    The epoch mirror is raised to the canceller's epoch inside the cancel's transaction, before its
    commit, so no event of the old holder lands after the cancel. After the commit each Redis step is
    independent (one failing skips none of the others), the slot release first; a cancel that finds the
    run already cancelled (a retry after a lost commit reply, a second click) does them again: all are
    idempotent."""

    def raise_mirror(epoch: int) -> None:
        try:
            raise_epoch(run_id, epoch)
        except Exception as exc:  # best effort (must not raise): the database fences the holder; raised again after
            log.warning("cancel_mirror_failed", run_id=run_id, epoch=epoch, error=repr(exc))

    result = lifecycle.cancel(run_id, by, user_id, before_commit=raise_mirror)
    if result.noop and result.previous_state != "cancelled":
        endings.ended_elsewhere(result.user_id, run_id)  # a finished run holds no slot
        return result
    endings.cancelled(result, by)
    if not result.noop:
        log.info("cancelled", run_id=run_id, epoch=result.epoch, by=by, previous_state=result.previous_state)
    return result


def reply_to_run(run_id: str, text: str, by: str, user_id: str | None = None) -> inputs.Input:
    """Store a person's reply (the run goes back to queued in the same transaction), then wake the run.
    `user_id`: the run must be this user's (InvalidRequest otherwise, nothing written); None = operator."""
    step, answered = inputs.reply(run_id, text, by, user_id)
    _wake(run_id, step, "reply")
    return answered


def replay_dead_letter(run_id: str, by: str) -> int:
    """Replay a dead run from its last checkpoint with a fresh delivery budget; returns its step.

    A replay is admitted like a new run (AdmissionRefused: the user's limit or the global backlog) and
    pays for what it uses (lifecycle.replay reopens a settled hold; InsufficientCredits). A refusal
    writes nothing and leaves no admission slot behind."""
    run = runs.get_run(run_id)
    if run is None:
        raise RunNotFound(f"no run {run_id!r}")
    if run.state != "dead":  # checked again under the row lock; here so a live run's slot is never touched
        raise InvalidRequest(f"run {run_id} is {run.state}; only dead runs can be replayed")
    admission.admit(run_id, run.user_id, ADMISSION_QUEUES)
    try:
        step = lifecycle.replay(run_id, by)
    except BaseException:
        _release_unless_replayed(run_id, run.user_id)
        raise
    try:
        _wake(run_id, step, "replay")
    finally:
        admission.mark_sent(run_id)  # the wake-up is on the continuation queue (or the sweeper owns it)
    return step


def _release_unless_replayed(run_id: str, user_id: str) -> None:
    """A replay that raised gives its slot back, unless it committed after all (a retried transaction
    whose first commit landed raises "not dead"): then the slot is the replayed run's."""
    try:
        run = runs.get_run(run_id)
    except StoreUnavailable as exc:  # in doubt keep it: the sweeper frees a slot whose run is not live
        log.warning("replay_slot_kept", run_id=run_id, error=repr(exc))
        return
    if run is None or run.state == "dead":
        admission.release_slot(user_id, run_id)


def _wake(run_id: str, step: int, reason: wakeup.Reason) -> None:
    try:
        wakeup.send(run_id, step, reason)
    except Exception as exc:  # any broker error: committed is committed, the sweeper sends the wake-up
        log.warning("wakeup_send_failed", run_id=run_id, error=repr(exc))
