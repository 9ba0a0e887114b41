"""The reaper: finds leases past their deadline in the index and rescues their runs, once each.

Cost per tick grows with the number of expired leases, not with runs in flight: one ZRANGEBYSCORE per
lease index shard (keys.LEASE_INDEX_SHARDS), all in one pipeline (on a Redis Cluster, one round trip
per node, in parallel).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog

from checkpoints import ledger
from fencing import keys, scripts
from fencing.connection import get_redis, process_token
from fencing.lease import now_ms
from fencing.scripts import scripts_for

log = structlog.get_logger("fencing.reaper")
Send = Callable[[str], None]  # send a fresh wake-up for a run (whatever step it is at)
RESCUE_YIELD_MS = 5000  # after a batch of rescues, inline steps yield to waiting wake-ups even with a slot free
RESCUE_YIELD_MIN_RUNS = 10  # ... a batch being at least this many runs


def rescue(run_id: str, grace_ms: int, reason: str, send: Send) -> bool:
    """Send a wake-up if the run has no lease and nobody rescued it within `grace_ms` (rescue_many of one)."""
    return bool(rescue_many([run_id], grace_ms, reason, send))


def rescue_many(run_ids: Sequence[str], grace_ms: int, reason: str, send: Send) -> list[str]:
    """Send a wake-up to each run that has no lease and that nobody rescued within `grace_ms`; returns
    those runs. In a fixed number of round trips however many runs (a process presumed dead may have
    held hundreds): the rescue markers in one pipeline, the reaper entries in one, the wake-ups, then
    the ledger entries (`rescue`, with the epoch being rescued as the Redis mirror knows it, -1 if Redis
    lost it) in one transaction. The worker's liveness ticks run inside `tasks.wakeup.batch`, so there
    `send` only buffers and every wake-up goes out in one broker round trip when the tick ends (after
    the ledger entries)."""
    if not run_ids:
        return []
    client = get_redis()
    registered = scripts_for(client)
    rescuer = process_token()
    marked = registered.execute_all(client, [scripts.rescue(run_id, grace_ms=grace_ms, rescuer=rescuer)
                                             for run_id in run_ids])
    chosen = [run_id for run_id, (code, _ms) in zip(run_ids, marked, strict=True) if code == 1]
    # A rescue already out (its marker blocks this one): that rescue's own index entry watches the run
    # until the marker expires, unless its rescuer died between the marker and the entry, or a path that
    # pops entries (the reaper) just took the last one. Re-added if missing (NX: never moved), due when
    # the marker expires, so whoever found the run unwatched never leaves it so.
    blocked = {run_id: int(ms) for run_id, (code, ms) in zip(run_ids, marked, strict=True) if code == 2}
    if not chosen:
        if blocked:
            _watch_blocked(client, blocked, reason)
        return []
    # Watched like a lease before the wake-up goes out: if no delivery takes the run within the grace (the
    # wake-up was swallowed by a worker that froze holding it, lost, or never sent because this process
    # died first), the reaper finds this entry and rescues again. The delivery that takes the lease
    # removes it (Lease.acquire).
    pipe = client.pipeline(transaction=False)
    now = now_ms()
    deadline = now + grace_ms
    for run_id in chosen:
        pipe.zadd(keys.lease_index(run_id), {keys.index_member(run_id, keys.RESCUE_HOLDER): deadline})
        pipe.get(keys.epoch(run_id))
    if len(chosen) >= RESCUE_YIELD_MIN_RUNS:
        # A batch (a dead process's runs): for a while inline steps yield to what waits on the continuation
        # queue even with a slot free (tasks.delivery._goes_on); a few runs find free slots like any wake-up.
        pipe.set(keys.RESCUES_UNDER_WAY, rescuer, px=RESCUE_YIELD_MS)
    _queue_blocked(pipe, blocked, now, reason)
    mirrors = pipe.execute()[1:2 * len(chosen):2]
    for run_id in chosen:
        send(run_id)
        log.warning("rescued", run_id=run_id, reason=reason)
    try:
        ledger.record_many([(run_id, int(mirror) if mirror is not None else -1, rescuer, "rescue", reason)
                            for run_id, mirror in zip(chosen, mirrors, strict=True)])
    except Exception as exc:  # the wake-ups are out; the records are best effort
        log.warning("rescue_record_failed", runs=len(chosen), error=repr(exc))
    return chosen


def _queue_blocked(pipe: object, blocked: dict[str, int], now: int, reason: str) -> None:
    """Queue on `pipe` the rescue index entry (NX) of each run whose rescue another is already out for,
    due when that rescue's marker expires; says so in the log (why this call sent nothing)."""
    for run_id, marker_ms in blocked.items():
        pipe.zadd(keys.lease_index(run_id),  # type: ignore[attr-defined]
                  {keys.index_member(run_id, keys.RESCUE_HOLDER): now + marker_ms}, nx=True)
        log.info("rescue_already_out", run_id=run_id, reason=reason, marker_ms=marker_ms)


def _watch_blocked(client: object, blocked: dict[str, int], reason: str) -> None:
    pipe = client.pipeline(transaction=False)  # type: ignore[attr-defined]
    _queue_blocked(pipe, blocked, now_ms(), reason)
    pipe.execute()


def reap(send: Send, lease_ttl_ms: int, batch: int = 100) -> list[str]:
    """One reaper tick: rescue runs whose lease deadline passed. Returns the runs rescued."""
    client = get_redis()
    registered = scripts_for(client)
    now = now_ms()
    rescued: list[str] = []
    expired = expired_entries(client, now, batch)
    if not expired:
        return rescued
    # Each entry is one holder's. A deadline is computed by the client before the server sets the
    # lease's PX, so a lease can outlive its entry by that pipeline's latency: such a lease is live, and
    # its entry moves to the lease's real expiry (GT: never earlier than a renewal put it). An entry
    # whose lease another holder has now is stale (that holder has its own entry) and just goes. One
    # round trip for the whole batch; the index and the leases stay in separate scripts, so no script
    # spans two Redis Cluster slots.
    pipe = client.pipeline(transaction=False)
    for member in expired:
        pipe.get(keys.lease(keys.index_run_id(member)))
        pipe.pttl(keys.lease(keys.index_run_id(member)))
    replies = pipe.execute()
    live: dict[str, int] = {}
    stale: list[str] = []
    for i, member in enumerate(expired):
        value, ttl = replies[2 * i], replies[2 * i + 1]
        if value is None:
            continue
        if value == keys.index_holder(member) and ttl > 0:
            live[member] = now + ttl
        else:
            stale.append(member)
    if live:
        pipe = client.pipeline(transaction=False)
        for index, entries in _by_shard(live).items():
            pipe.zadd(index, entries, gt=True)
        pipe.execute()
    candidates = [member for member in expired if member not in live]
    popped = registered.execute_all(client, [scripts.pop_expired(member=member, now_ms=now) for member in candidates])
    # Popped and not stale: the run has no other holder (a stale entry's run is watched under its own
    # entry); a member not popped was renewed meanwhile, or another reaper took it. The marker blocks a
    # second rescue until a delivery takes the lease (acquire clears it) or one lease lifetime passes, so
    # a dead rescuer is reaped again on time.
    due = [keys.index_run_id(member) for member, took in zip(candidates, popped, strict=True)
           if took and member not in stale]
    rescued += rescue_many(list(dict.fromkeys(due)), lease_ttl_ms, "lease expired without a handover", send)
    return rescued


def expired_entries(client: object, now: int, batch: int) -> list[str]:
    """Up to `batch` index entries whose deadline is at or before `now`, read from every shard in one
    pipeline (the oldest `batch` of each shard, then the oldest `batch` of those)."""
    pipe = client.pipeline(transaction=False)  # type: ignore[attr-defined]
    for index in keys.LEASE_INDEXES:
        pipe.zrangebyscore(index, "-inf", now, start=0, num=batch, withscores=True)
    found: list[tuple[str, float]] = [entry for shard in pipe.execute() for entry in shard]
    if len(found) > batch:
        found = sorted(found, key=lambda entry: entry[1])[:batch]
    return [member for member, _deadline in found]


def _by_shard(entries: dict[str, int]) -> dict[str, dict[str, int]]:
    """Index entries (member -> deadline) grouped by the shard each belongs in."""
    out: dict[str, dict[str, int]] = {}
    for member, deadline in entries.items():
        out.setdefault(keys.lease_index(keys.index_run_id(member)), {})[member] = deadline
    return out
