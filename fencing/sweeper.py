"""The sweeper: runs the database calls live but that have no lease and no progress get a wake-up.

Covers what the reaper cannot see: Redis lost its data (no lease, no index, no queue), an API that
crashed between commit and send, a lost continuation. One worker sweeps per interval. Each sweep also
makes the admission slots follow the runs' state (`admission.reconcile_slots`).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from checkpoints import inputs, lifecycle, runs
from checkpoints.db import in_txn
from fenced_core.errors import FencedOut
from fenced_core.settings import get_settings
from fencing import admission, events, keys
from fencing.connection import get_redis, process_token
from fencing.lease import now_ms
from fencing.reaper import rescue
from fencing.turns import take_turn

log = structlog.get_logger("fencing.sweeper")
# Stalled rows are read in pages (keyset, oldest first), so runs stuck behind hung ones (whose leases
# live) are still reached; MAX_PAGES bounds one sweep, and the next sweep starts over.
PAGE = 500
MAX_PAGES = 20


# (user_id, run_id) of a run the sweep just ended `failed`/expired: tasks.endings.expired follows it up
# (slot, final event, hooks); without one, the slot and the final event are done here.
Expired = Callable[[str, str], None]


def sweep(send: Callable[[str], None], force: bool = False, expired: Expired | None = None) -> list[str]:
    """One sweep, if no other worker swept within the interval (or `force`). Returns runs rescued.

    `expired(user_id, run_id)` follows up each run whose hold expired before any worker claimed it
    (its row is `failed`, class "expired", once this sweep's transaction committed)."""
    s = get_settings()
    client = get_redis()
    if not force and not take_turn(client, keys.SWEEPER_LOCK, process_token(), s.sweeper_interval_ms):
        return []
    now = now_ms()
    # A run left waiting on a question that was answered would wait forever: queued again, it is
    # woken below like any stalled run.
    requeued = in_txn(inputs.requeue_answered_txn, process_token())
    if requeued:
        log.warning("answered_runs_requeued", runs=len(requeued))
    rescued = []
    after: tuple[int, str] | None = None
    for _page in range(MAX_PAGES):
        stalled = runs.stalled(now - s.sweeper_grace_ms, PAGE, after)
        if not stalled:
            break
        pipe = client.pipeline(transaction=False)
        for run_id, _step, _kind, _at in stalled:
            pipe.exists(keys.lease(run_id))
        for (run_id, step, _kind, at), has_lease in zip(stalled, pipe.execute(), strict=True):
            if has_lease:
                continue
            # A stall: nothing scheduled the run (a lost message, a wiped Redis); found, it is said so.
            reason = (f"no lease and no progress for {s.sweeper_grace_ms} ms at step {step} (stalled "
                      f"{(now - at) / 1000:.1f} s since its last progress): woken by the sweeper")
            if rescue(run_id, s.sweeper_grace_ms, reason, send):
                rescued.append(run_id)
        if len(stalled) < PAGE:
            break
        after = (stalled[-1][3], stalled[-1][0])
    closed = in_txn(lifecycle.close_stale_holds_txn, now, process_token())
    for hold in closed:
        if hold.outcome == "released":
            (expired or _expired)(hold.user_id, hold.run_id)
        else:
            admission.release_slot(hold.user_id, hold.run_id)
    if closed:
        log.warning("holds_closed", released=sum(h.outcome == "released" for h in closed),
                    settled=sum(h.outcome == "settled" for h in closed))
    try:
        # Slots follow run state: kept for live runs (rebuilt after a wipe), freed for ended ones.
        admission.reconcile_slots(client)
    except Exception as exc:  # the next sweep tries again; rescues above are done either way
        log.warning("slot_reconcile_failed", error=repr(exc))
    return rescued


EXPIRED_EVENT_DATA = {"error_class": "expired", "error": "no worker picked the run up before its hold expired"}


def _expired(user_id: str, run_id: str) -> None:
    admission.release_slot(user_id, run_id)
    end_expired_stream(run_id)


def end_expired_stream(run_id: str) -> None:
    """An expired run (never claimed; its row now `failed`) ends its stream like every terminal state.
    Best effort, never raises: the row is the truth, and a later wake-up repairs the stream."""
    try:
        events.append_final(run_id, 0, "failed", 0, dict(EXPIRED_EVENT_DATA))
    except (Exception, FencedOut) as exc:  # best effort after the commit (see above)
        log.warning("expired_event_failed", run_id=run_id, error=repr(exc))
