"""The one place a run's ending is followed up: after its terminal write commits (checkpoints.runs.finish /
dead_letter, checkpoints.lifecycle.cancel), the admission slot goes back, the stream gets its final event
under the state's fixed id, and the hooks hear of it; a later delivery repairs what a crash left out.
The Redis follow-ups after a committed ending are the genuinely best-effort places that catch any
exception: nothing may undo or stop an ending that committed, and each follow-up is repeated (a
repair, the sweeper) when it failed.

Order and crash story: the terminal write is the truth and commits first. A holder that dies after it
leaves its lease unreleased, so a rescue brings a delivery that finds the row terminal and calls
`repair` (slot, final event; the sweeper's reconcile frees a slot in any case). Hooks are notices of
the committing process only: a repair never calls them again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import structlog

from checkpoints import runs
from checkpoints.lifecycle import Cancelled
from checkpoints.runs import Claim
from fenced_core.errors import FencedOut
from fencing import admission, dead_letters, events, lease, scripts, sweeper
from fencing.epoch import raise_epoch
from tasks import hooks

log = structlog.get_logger("tasks.endings")


class Emit(Protocol):
    """How the committing holder appends (the step runner's emit raises the mirror): one event, with
    `riders` (other script calls, plain commands) in its round trip ahead of it."""

    def __call__(self, eid: str, type_: str, data: dict[str, Any] | None = None,
                 riders: Sequence[scripts.Call | scripts.Command] = ()) -> events.Appends: ...


def finished(c: Claim, state: str, data: dict[str, Any], emit: Emit, held: lease.Lease | None = None) -> None:
    """Follow up a committed `done`/`failed` terminal write by holder `c`: slot back, the lease `held`
    let go, and the final event, in one round trip (the releases first: a client that sees the final
    event finds the slot free), then on_finished. The lease's release is the one its delivery would send
    after the step (`held.released` then says it went; a lease the step timeout gave up is left to run
    out, as the delivery leaves it). A failed round trip raises (after the hooks): the delivery then
    lets go of the lease and asks for a rescue, and the rescue's delivery repairs the stream and the slot
    (`repair`; the sweeper's reconcile frees a slot in any case)."""
    run_id = c.run.run_id
    letting_go = held if held is not None and not held.timed_out else None
    riders = [admission.release_call(c.run.user_id, run_id), *(letting_go.release_calls() if letting_go else [])]
    try:
        appends = emit(*events.FINAL_EVENTS[state], data, riders=riders)
        if letting_go:
            letting_go.released = appends.riders_ran
    finally:
        hooks.finished(run_id, c.epoch, state, data)


def dead_letter(c: Claim, reason: str, observations: dict[str, Any]) -> None:
    """Dead-letter the run: the fenced database write (checkpoints.runs.dead_letter; the hold stays held
    for a replay), then slot back, the dead-letter stream notice and `run_dead`, then on_dead_letter.
    The Redis follow-ups are best effort: the database says dead, and the next delivery repairs the
    final event."""
    run, epoch = c.run, c.epoch
    attempts = runs.dead_letter(c, reason, observations)
    admission.release_slot(run.user_id, run.run_id)
    try:
        dead_letters.add(run.run_id, run.step, reason, len(attempts))
        events.append_final(run.run_id, epoch, "dead", run.step, {"reason": reason}, raise_mirror=True)
    except (Exception, FencedOut) as exc:  # best effort after the commit: Redis down, a replay claimed it
        log.warning("dead_letter_redis_failed", run_id=run.run_id, epoch=epoch, error=repr(exc))
    log.error("dead_lettered", run_id=run.run_id, epoch=epoch, reason=reason)
    hooks.dead_lettered(run.run_id, epoch, run.step, reason)


def cancelled(result: Cancelled, by: str) -> None:
    """Follow up a cancel (checkpoints.lifecycle.cancel; a no-op cancel of a cancelled run too: a retry
    after a lost commit reply, a second click). Each step is idempotent and independent, none skips
    another: slot back, the epoch mirror raised again (Redis may have lost it), `run_cancelled` unless it
    is already the newest event, the old holder's lease dropped (its watchdog sees it and stops at the
    next boundary), and on_finished once, for the cancel that committed."""
    run_id, epoch = result.run_id, result.epoch
    admission.release_slot(result.user_id, run_id)
    try:
        raise_epoch(run_id, epoch)
    except Exception as exc:  # best effort after the commit: the database fences the holder anyway
        log.warning("cancel_mirror_failed", run_id=run_id, epoch=epoch, error=repr(exc))
    data: dict[str, Any] = {"by": by, "previous_state": result.previous_state,
                            "credits_charged": result.credits_charged}
    if result.noop:
        data = {"by": by, "repaired": True}
    try:
        events.append_final(run_id, epoch, "cancelled", -1, data, unless_present=True)
    except (Exception, FencedOut) as exc:  # best effort: no newer epoch can exist after a cancel; never raise
        log.warning("cancel_event_failed", run_id=run_id, epoch=epoch, error=repr(exc))
    try:
        lease.drop(run_id)
    except Exception as exc:  # best effort: the lease runs out by itself
        log.warning("cancel_lease_delete_failed", run_id=run_id, epoch=epoch, error=repr(exc))
    if not result.noop:
        hooks.finished(run_id, epoch, "cancelled", data)


def expired(user_id: str, run_id: str) -> None:
    """Follow up a run the sweeper ended `failed` (class "expired": its hold ran out before any worker
    claimed it; the sweeper's transaction committed): slot back, final event, then on_finished."""
    admission.release_slot(user_id, run_id)
    sweeper.end_expired_stream(run_id)
    hooks.finished(run_id, 0, "failed", dict(sweeper.EXPIRED_EVENT_DATA))


def ended_elsewhere(user_id: str, run_id: str) -> None:
    """A run found already ended by someone else (a cancel of a finished run): its slot goes back."""
    admission.release_slot(user_id, run_id)


def repair(run: runs.Run) -> None:
    """A delivery found the run terminal: its holder may have died between the terminal commit and the
    final event or the slot release (its lease was never released, so a rescue brings us here). The row
    is the truth: the slot goes back and the final event is said with its fixed id unless it is the
    newest event already. Best effort; no hooks (the committing process called them, or died)."""
    admission.release_slot(run.user_id, run.run_id)
    if run.state not in events.FINAL_EVENTS:
        return
    data: dict[str, Any] = {"answer": run.answer, "repaired": True} if run.state == "done" else {
        "error_class": run.error_class, "error": run.error, "repaired": True}
    try:
        if events.append_final(run.run_id, run.epoch, run.state, run.step, data, unless_present=True):
            log.warning("final_event_repaired", run_id=run.run_id, epoch=run.epoch, state=run.state)
    except (Exception, FencedOut) as exc:  # best effort: the database already says how the run ended
        log.warning("final_event_repair_failed", run_id=run.run_id, epoch=run.epoch, error=repr(exc))
