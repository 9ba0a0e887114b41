"""One delivery of run_agent(run_id, step): skip, drop, claim, run the step, hand over. See DESIGN.md."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import structlog
from celery.worker import state as worker_state

from checkpoints import ledger, runs
from fenced_core.errors import FencedOut, LeaseLost, StoreUnavailable
from fenced_core.settings import INLINE_WINDOW_S, get_settings
from fencing import broker, events
from fencing.epoch import raise_epoch
from fencing.lease import Lease, now_ms, rescue_answered
from fencing.watchdog import get_watchdog
from routing import policy
from tasks import endings, hooks, queues, wakeup
from tasks.step import StepRunner

log = structlog.get_logger("tasks.delivery")


def deliver(run_id: str, step: int | None, send_next: Callable[[str, int], None] = wakeup.continuation,
            inline: int = 0) -> str:
    """Handle one wake-up; returns what happened (for logs and tests). `send_next(run_id, step)` sends the
    continuation, after the lease is handed over (never before: it would be dropped as a duplicate).
    With `inline` > 0, up to that many following steps run in this delivery when each is ready at once
    (`_goes_on` says when, and why that is as safe as a handoff); the outcome is then the last step's.

    A store outage (StoreUnavailable) mid-delivery ends it "store_unavailable": the lease is let go with
    our index entry due now, so the reaper rescues the run on its next tick; a crash anywhere is taken
    over from the last checkpoint."""
    with _in_a_slot():
        return _deliver(run_id, step, send_next, inline)


def _deliver(run_id: str, step: int | None, send_next: Callable[[str, int], None], inline: int) -> str:
    s = get_settings()
    lease = Lease(run_id, s.lease_ttl_ms)
    if step is None:
        # A rescue (rescues carry no step): the row says whether there is anything to do, and which
        # step's handoff the rescue may take (a continuation lost after its handoff was set).
        skipped, run = _look(run_id)
        if skipped is not None:
            return skipped
        assert run is not None
        if not lease.acquire(run.step):
            log.warning("duplicate_dropped", run_id=run_id, epoch=run.epoch, step=run.step)
            return "duplicate"
    elif not lease.acquire(step):
        # Held by someone, or handed over for another step: a duplicate or stale wake-up either way.
        log.warning("duplicate_dropped", run_id=run_id, step=step)
        return "duplicate"
    # The lease is ours. No row read before the claim: the claim reads the row locked and claims only a
    # live run at this step; when it claims nothing, that row says why (`_judge`, as for a rescue). A
    # handoff taken for this step says the row was at it (the previous holder set it only after checkpoint
    # B of step - 1 committed). The lease found free (the handoff expired, Redis lost it, the run ended,
    # parked, or this is its first wake-up) proves nothing: a refusal then lets it go with our index entry
    # due now, so a wake-up refused while we held it is rescued (docs/design.md, "Round trips removed").
    found_free = step is not None and not lease.took_handoff
    watchdog = get_watchdog(s.heartbeat_ms)
    began = time.monotonic()
    handoff: int | None = None
    outcome = "error"
    ran = 0
    claimed: runs.Claim | None = None

    def goes_on(appends: events.Appends) -> bool:
        return _goes_on(lease, ran, inline, began, appends)

    try:
        while True:
            outcome = "error"
            # Renewed from now on: a claim that waits on the database (a frozen holder's row lock) must not
            # lose the lease meanwhile. The step timeout counts from here too, for each step.
            watchdog.track(lease, s.step_timeout_s)
            outcome, handoff, claimed = _claim_and_run(run_id, step, lease, claimed, goes_on)
            if claimed is None:
                return outcome
            # Inline: checkpoint B claimed the next step for this delivery, holding the lease all along (see
            # `_goes_on`); no handoff, no message, no second delivery. track() restarts the step timeout.
            ran, step, handoff = ran + 1, handoff, None
    finally:
        watchdog.untrack(lease)
        rescue_soon = outcome in ("lease_lost", "store_unavailable", "error") or (outcome in _REFUSED and found_free)
        _let_go(lease, handoff, rescue_soon=rescue_soon)
        if handoff is not None:
            send_next(run_id, handoff)


class _Inlining:
    """Whether this process may run steps inline at all: not once its worker drains (a warm shutdown
    waits for deliveries in flight; each should end at its step, not at its run's), not in a prefork
    child (which never hears of the drain); tasks.app switches it off for both. And how many deliveries
    the process runs at once (`slots`: its pool's size, None when unknown) against how many it runs now."""

    allowed = True
    slots: int | None = None
    busy = 0
    lock = threading.Lock()


def stop_inlining() -> None:
    """From now on every delivery of this process hands its next step over through the broker."""
    _Inlining.allowed = False


def set_slots(slots: object) -> None:
    """The number of deliveries this process runs at once (its worker's pool size; tasks.bootsteps);
    anything but a positive int (None, Celery's unresolved "auto") leaves it unknown."""
    _Inlining.slots = slots if isinstance(slots, int) and slots > 0 else None


@contextmanager
def _in_a_slot() -> Iterator[None]:
    with _Inlining.lock:
        _Inlining.busy += 1
    try:
        yield
    finally:
        with _Inlining.lock:
            _Inlining.busy -= 1


def _a_slot_is_free() -> bool:
    """Whether this process has a free slot, i.e. its worker is taking wake-ups off the queue itself.
    Busy slots: its deliveries, or every task its worker runs (Celery's own count: a user's FencedTasks
    take slots too), whichever is more."""
    if _Inlining.slots is None:
        return False
    return max(_Inlining.busy, len(worker_state.active_requests)) < _Inlining.slots


def _goes_on(lease: Lease, ran: int, inline: int, began: float, appends: events.Appends | None = None) -> bool:
    """Whether the delivery whose step has done its work runs the next one itself (up to `inline` more):
    asked by the step before its checkpoint B, which then claims the next step in the same transaction
    (checkpoints.runs.write_step_done_and_claim).

    Safe as a handoff is: the lease never left this delivery, and the renewal proves it is still ours at
    this instant, so no other delivery can have claimed the run; the transaction that follows is fenced
    by this claim's epoch and raises it, so it writes only if nothing else touched the row since (every
    other writer raises the epoch). A lease lost meanwhile (expired, taken over) goes the ordinary way:
    checkpoint B alone, release (refused) and a continuation, which the holder's delivery drops. Not
    under `reach` routing, which decides where each step runs, and not while wake-ups wait on the
    continuation queue and every slot of this process is taken (with a slot free the worker takes them
    itself), or a batch of rescues went out lately (fencing.broker.renewed_and_going_on).
    docs/design.md, "Round trips removed", has the whole argument.

    `appends` (the step's step_done event) ride at the head of the renewal, when one is sent (their `ids`
    then set); a refused one raises FencedOut (an Interrupt: no `except Exception` below swallows it)."""
    if ran >= inline or not _Inlining.allowed or lease.timed_out:
        return False
    if time.monotonic() - began >= INLINE_WINDOW_S or policy.reach():
        return False
    try:
        # Every slot taken: wake-ups waiting on the continuation queue (other runs' next steps, rescues,
        # replies) would wait behind this run's further steps. They go first, as the queue order says,
        # and this run's next step queues up behind them. With a slot free they wait on the broker's
        # hand-out, not on a slot of ours: handing over would only add one more to them (and under load
        # every finishing step would, for good), unless rescues are under way.
        return broker.renewed_and_going_on(lease, queues.CONTINUE, _a_slot_is_free(), appends)
    except Exception as exc:  # Redis or the broker down: hand over the ordinary way (that may fail the same)
        log.warning("inline_check_failed", run_id=lease.run_id, error=repr(exc))
        return False


def _claim_and_run(run_id: str, step: int | None, lease: Lease, claimed: runs.Claim | None,
                   goes_on: Callable[[events.Appends], bool]) -> tuple[str, int | None, runs.Claim | None]:
    """Claim `step` under the lease we hold (or take `claimed`, this delivery's inline claim of it) and run
    it: (outcome, the step to hand over to or None, this delivery's claim of that step if it goes on)."""
    s = get_settings()
    claim = claimed
    try:
        if claim is not None:
            # Claimed with the last step's checkpoint B; the lease may have been lost since (a step timeout
            # that fired meanwhile): then the step is not run, and a takeover resumes it.
            if lease.lost:
                raise LeaseLost(run_id)
        else:
            # The claim runs on the row as it is now, whatever a snapshot read before it said.
            found = runs.claim_or_row(run_id, lease.token, step)
            if not isinstance(found, runs.Claim):
                return _judge(run_id, step, found) or "skipped", None, None
            claim = found
        lease.epoch = claim.epoch
        blog = log.bind(run_id=run_id, epoch=claim.epoch, step=claim.run.step)
        hooks.claimed(run_id, claim.epoch, claim.run.step, claim.run.agent)
        if claim.takeover:
            hooks.took_over(run_id, claim.epoch, claim.run.step, claim.previous_owner, claim.run.phase)
        # The step raises the epoch mirror with its first event append (one round trip less); a dead
        # letter appends nothing before its fenced database write, so it raises the mirror here.
        if claim.deliveries > s.max_deliveries:
            if raise_epoch(run_id, claim.epoch) > claim.epoch:
                raise FencedOut(run_id, claim.epoch, "epoch mirror")
            endings.dead_letter(claim, f"step {claim.run.step} claimed {claim.deliveries - 1} times without finishing",
                        {"worker": lease.token, "phase": claim.run.phase, "previous_owner": claim.run.owner})
            return "dead", None, None
        result = StepRunner(claim, lease, goes_on).run_step()
        blog.info("delivery_done", outcome=result.state, inline=claimed is not None)
        return result.state, result.next_step, result.claimed
    except FencedOut as exc:
        log.warning("fenced_out", run_id=run_id, epoch=exc.epoch, at=exc.what)
        if claim is not None:
            _close(claim, "fenced_out", str(exc))
            hooks.fenced_out(run_id, claim.epoch, exc.what)
            ledger.record(run_id, claim.epoch, lease.token, "fence_rejected",
                          f"write refused at {exc.what}: a newer epoch owns the run; stopped without terminal write")
        return "fenced_out", None, None
    except LeaseLost as exc:
        log.warning("lease_lost_stopping", run_id=run_id, epoch=claim.epoch if claim else None,
                    step_timeout=lease.timed_out)
        if claim is not None:
            _close(claim, "step_timeout" if lease.timed_out else "lease_lost", str(exc))
        return "lease_lost", None, None
    except StoreUnavailable as exc:
        log.error("store_unavailable", run_id=run_id, epoch=claim.epoch if claim else None, error=repr(exc))
        return "store_unavailable", None, None


# How a delivery ends when the row refuses its wake-up (`_judge`).
_REFUSED = ("unknown", "skipped", "stale")


def _look(run_id: str) -> tuple[str | None, runs.Run | None]:
    """A rescue's read of the row (without its checkpoint) before it takes the lease: (how the delivery
    ends, None) when there is nothing to do, else (None, the row)."""
    run = runs.peek_run(run_id)
    skipped = _judge(run_id, None, run)
    return (skipped, None) if skipped is not None else (None, run)


def _judge(run_id: str, step: int | None, run: runs.Run | None) -> str | None:
    """How the delivery ends by the row `run` (None: no such run): "unknown", "skipped" (ended or waiting),
    "stale" (at another step than `step`); None when it is live at that step. An ended run's final event
    and slot are repaired; a rescue that finds nothing to do is answered."""
    if run is None:
        log.warning("unknown_run", run_id=run_id)
        rescue_answered(run_id)
        return "unknown"
    if run.terminal:
        # Its holder may have died between the terminal commit and the final event or the slot release.
        endings.repair(run)
    if run.terminal or run.state == "waiting":
        log.info("skip_not_live", run_id=run_id, epoch=run.epoch, state=run.state)
        if step is None:  # a rescue: answered
            rescue_answered(run_id)
        return "skipped"
    if step is not None and step != run.step:
        log.info("stale_wakeup_dropped", run_id=run_id, epoch=run.epoch, message_step=step, run_step=run.step)
        return "stale"
    return None


def _close(claim: runs.Claim, outcome: str, error: str) -> None:
    try:
        runs.end_attempt(claim.attempt_id, outcome, error)
    except StoreUnavailable as exc:  # the record is best effort; the fence already did its job
        log.warning("attempt_close_failed", run_id=claim.run.run_id, epoch=claim.epoch, error=repr(exc))


def _let_go(lease: Lease, handoff: int | None, rescue_soon: bool) -> None:
    """Release or hand over the lease; a delivery that stopped early asks the reaper to look now.

    A lease the step timeout let go is left to run out (a wedged thread may still be in a write), so
    the takeover comes after step timeout + lease, as the watchdog's ledger entry says."""
    try:
        if lease.timed_out or lease.released:  # left to run out; let go with the run's final event
            return
        if rescue_soon:
            # Drop our lease (if still ours); our own index entry comes due now, so the reaper rescues
            # the run on its next tick. Only our entry: a newer holder's stays as it is.
            lease.release(None, watch_until_ms=now_ms())
        else:
            lease.release(handoff)
    except StoreUnavailable as exc:  # Redis down: the lease expires by itself and the sweeper takes over
        log.warning("lease_release_failed", run_id=lease.run_id, error=repr(exc))
