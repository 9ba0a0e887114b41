"""The sweeper: runs the database calls live but that have no lease and no progress get a wake-up.

Covers what the reaper cannot see: Redis lost its data (no lease, no index, no queue), an API that
crashed between commit and send, a lost continuation. One worker sweeps per interval. Each sweep also
makes the admission slots follow the runs' state (`admission.reconcile_slots`).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from checkpoints import billing, runs
from checkpoints.db import in_txn
from fenced.settings import get_settings
from fencing import admission, keys
from fencing.connection import get_redis, process_token
from fencing.lease import now_ms
from fencing.reaper import rescue

log = structlog.get_logger("fencing.sweeper")


def sweep(send: Callable[[str], None], force: bool = False) -> list[str]:
    """One sweep, if no other worker swept within the interval (or `force`). Returns runs rescued."""
    s = get_settings()
    client = get_redis()
    if not force and not client.set(keys.SWEEPER_LOCK, process_token(), nx=True, px=s.sweeper_interval_ms):
        return []
    now = now_ms()
    stalled = runs.stalled(now - s.sweeper_grace_ms)
    rescued = []
    if stalled:
        pipe = client.pipeline(transaction=False)
        for run_id, _step, _kind in stalled:
            pipe.exists(keys.lease(run_id))
        for (run_id, step, _kind), has_lease in zip(stalled, pipe.execute(), strict=True):
            if has_lease:
                continue
            reason = f"no lease and no progress for {s.sweeper_grace_ms} ms at step {step}"
            if rescue(run_id, s.sweeper_grace_ms, reason, send):
                rescued.append(run_id)
    closed = in_txn(billing.close_stale_holds_txn, now, process_token())
    for hold in closed:
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
