"""Admission: one Lua step admits a run under the global backlog and per-user limits, or refuses it.

A user's slots follow the state of the user's runs in the database, not their age: a slot is taken at
admission, given back when the run ends (`release_slot`), and `reconcile_slots` (the sweeper, one
worker per interval) refreshes the slot of every queued/running/waiting run, re-adds it after a Redis
wipe, and frees slots whose run ended or never came to exist (a lost release, a dead submitter)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import structlog

from fenced_core.errors import AdmissionRefused
from fenced_core.settings import get_settings, safe_url
from fencing import keys, registry, scripts
from fencing.broker import get_broker_redis, shares_redis
from fencing.connection import get_redis
from fencing.lease import now_ms
from fencing.scripts import scripts_for

log = structlog.get_logger("fencing.admission")

# The run row's transaction retries for up to 60 s (checkpoints.db.db_retry); an entry still unsent
# after twice that belongs to a submitter that died, and must stop counting against the backlog.
UNSENT_TTL_MS = 120_000
# Hints only: a backlog drains at the workers' pace, a user's runs take seconds to minutes.
RETRY_AFTER_GLOBAL_S = 2.0
RETRY_AFTER_USER_S = 5.0
RETRY_AFTER_UNAVAILABLE_S = 1.0
# HASH run_id -> user_id of every slot: lets the sweeper find slots without scanning the keyspace. Same
# {admission} tag as the slots, so admit.lua and release_slot touch one Cluster slot.
SLOT_OWNERS = f"{keys.PREFIX}:{keys.ADMISSION_TAG}:slot-owners"
# A slot whose run has no row, or an ended one, is freed only once it is this old: a submitter's (or
# a replay's) transaction retries for up to 60 s after its admission, and must not lose its slot.
SLOT_GRACE_MS = UNSENT_TTL_MS
RECONCILE_PAGE = 500


@dataclass(frozen=True)
class Admission:
    """An admitted run and what it counted against."""

    run_id: str
    user_id: str
    waiting: int  # undelivered + admitted-not-sent runs, this one included
    user_runs: int  # the user's admitted, unfinished runs, this one included


def _backlog_inputs(queues: Sequence[str]) -> tuple[list[str], int]:
    """The broker queue keys admit.lua counts itself, or, when the broker is another Redis (which a
    script cannot read), no keys and their lengths counted just before (a little less exact); and the
    backlog counted outside the script.

    Under FENCED_ROUTING=reach first wake-ups wait in the workers' own queues or nowhere (deferred: no
    worker qualified), not in `queues`: the first-wake-up queue of every worker not offline joins the
    lists counted (its continuation queue does not), and the deferred wake-ups the outside count (one
    more round trip, to fenced's Redis). The deferred set also holds continuations and rescues (a
    deferred entry does not say which it is): the backlog may count a little more than runs waiting to
    start, never less."""
    s = get_settings()
    list_keys = [keys.broker_queue(q) for q in queues]
    outside = 0
    if s.routing == "reach":
        own, deferred = registry.routed_backlog(registry.now_ms() - registry.offline_after_ms())
        list_keys += [keys.broker_queue(q) for q in own]
        outside = deferred
    if shares_redis():
        return list_keys, outside
    pipe = get_broker_redis().pipeline(transaction=False)
    for key in list_keys:
        pipe.llen(key)
    return [], outside + sum(pipe.execute())


def _admit_call(run_id: str, user_id: str, list_keys: list[str], outside: int, now: int) -> Any:
    """admit.lua's call for one run, with the current limits."""
    s = get_settings()
    return scripts.admit(
        unsent_key=keys.ADMITTED_UNSENT, user_slots_key=keys.user_slots(user_id), slot_owners_key=SLOT_OWNERS,
        queue_keys=list_keys, run_id=run_id, now_ms=now, max_queued=s.max_queued_runs,
        max_per_user=s.max_runs_per_user, slot_ttl_ms=s.admission_ttl_s * 1000, unsent_ttl_ms=UNSENT_TTL_MS,
        outside_backlog=outside, user_id=user_id)


def admit(run_id: str, user_id: str, queues: Sequence[str], client: redis.Redis | None = None) -> Admission:
    """Take a slot for `run_id` or raise AdmissionRefused (nothing taken). `queues`: where new runs wait.

    Redis unreachable refuses too ("unavailable"): the broker is usually that same Redis, so the
    wake-up could not be sent either."""
    s = get_settings()
    client = client or get_redis()
    try:
        list_keys, outside = _backlog_inputs(queues)
        ok, limit, count, extra = scripts_for(client)(_admit_call(run_id, user_id, list_keys, outside, now_ms()))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise AdmissionRefused("unavailable", RETRY_AFTER_UNAVAILABLE_S,
                               f"Redis is unreachable at {safe_url(s.redis_url)} ({exc}): the run was not "
                               "admitted and nothing was written") from exc
    except redis.RedisError as exc:
        raise AdmissionRefused("unavailable", RETRY_AFTER_UNAVAILABLE_S,
                               f"admission refused: Redis answered with an error ({exc}); nothing was written; "
                               f"retry in {RETRY_AFTER_UNAVAILABLE_S:g} s") from exc
    if ok:
        return Admission(run_id, user_id, waiting=int(count), user_runs=int(extra))
    raise _refusal(run_id, user_id, str(limit), int(count), int(extra))


def _refusal(run_id: str, user_id: str, limit: str, count: int, extra: int) -> AdmissionRefused:
    s = get_settings()
    if limit == "user":
        retry = max(min(RETRY_AFTER_USER_S, extra / 1000), 0.1)  # extra: ms until the oldest slot is pruned
        message = (f"admission refused: user {user_id!r} has {count} unfinished runs "
                   f"(limit max_runs_per_user={s.max_runs_per_user}); retry in {retry:g} s")
    else:
        retry = RETRY_AFTER_GLOBAL_S
        message = (f"admission refused: {count} runs are waiting to start "
                   f"(limit max_queued_runs={s.max_queued_runs}); retry in {retry:g} s")
    log.info("admission_refused", run_id=run_id, user_id=user_id, limit=limit, count=count)
    return AdmissionRefused(limit, retry, message)


def admit_many(items: Sequence[tuple[str, str]], queues: Sequence[str],
               client: redis.Redis | None = None) -> list[Admission | AdmissionRefused]:
    """`admit` for each (run_id, user_id), in order, in ONE round trip (admit.lua once per run,
    pipelined): each run is admitted or refused on its own, atomically, and a refused one takes nothing.
    A later item sees the slots the earlier ones took. Redis unreachable refuses every item
    ("unavailable"); a crash mid-pipeline leaves slots that `reconcile_slots` frees (no row)."""
    if not items:
        return []
    s = get_settings()
    client = client or get_redis()
    registered = scripts_for(client)
    try:
        list_keys, outside = _backlog_inputs(queues)
        now = now_ms()

        def build(pipe: redis.client.Pipeline) -> None:
            for run_id, user_id in items:
                registered.queue(pipe, _admit_call(run_id, user_id, list_keys, outside, now))

        replies = registered.execute(client, build)
    except redis.RedisError as exc:
        refused = AdmissionRefused("unavailable", RETRY_AFTER_UNAVAILABLE_S,
                                   f"admission refused: Redis is unreachable at {safe_url(s.redis_url)} or "
                                   f"answered with an error ({exc}); nothing was written; retry in "
                                   f"{RETRY_AFTER_UNAVAILABLE_S:g} s")
        return [refused for _ in items]
    out: list[Admission | AdmissionRefused] = []
    for (run_id, user_id), (ok, limit, count, extra) in zip(items, replies, strict=True):
        out.append(Admission(run_id, user_id, waiting=int(count), user_runs=int(extra)) if ok
                   else _refusal(run_id, user_id, str(limit), int(count), int(extra)))
    return out


def mark_sent_many(run_ids: Sequence[str], client: redis.Redis | None = None) -> None:
    """`mark_sent` for many runs in one round trip (never raises: entries are pruned after UNSENT_TTL_MS)."""
    if not run_ids:
        return
    try:
        (client or get_redis()).zrem(keys.ADMITTED_UNSENT, *run_ids)
    except redis.RedisError as exc:
        log.warning("admission_mark_sent_failed", runs=len(run_ids), error=repr(exc))


def release_call(user_id: str, run_id: str) -> scripts.Call:
    """The script call that gives `run_id`'s slot back (release_slot.lua: idempotent, atomic), to run now
    (`release_slots`) or to ride in another round trip (a run's final event: tasks.endings.finished)."""
    return scripts.release_slot(user_slots_key=keys.user_slots(user_id), unsent_key=keys.ADMITTED_UNSENT,
                                slot_owners_key=SLOT_OWNERS, run_id=run_id)


def release_slots(slots: Sequence[tuple[str, str]], client: redis.Redis | None = None) -> int:
    """`release_slot` for many (user_id, run_id) in one round trip; idempotent, never raises (the
    sweeper's `reconcile_slots` frees what a lost release left). Returns how many slots were freed."""
    if not slots:
        return 0
    client = client or get_redis()
    try:
        replies = scripts_for(client).execute_all(client, [release_call(u, r) for u, r in slots])
    except redis.RedisError as exc:
        log.warning("admission_release_failed", runs=len(slots), run_id=slots[0][1], error=repr(exc))
        return 0
    return sum(int(r) for r in replies)


def mark_sent(run_id: str, client: redis.Redis | None = None) -> None:
    """The first wake-up went out (or failed and the sweeper owns it): stop counting it as unsent."""
    try:
        (client or get_redis()).zrem(keys.ADMITTED_UNSENT, run_id)
    except redis.RedisError as exc:  # pruned after UNSENT_TTL_MS anyway
        log.warning("admission_mark_sent_failed", run_id=run_id, error=repr(exc))


def release_slot(user_id: str, run_id: str, client: redis.Redis | None = None) -> bool:
    """Give the user's slot back (the run ended, or was never created). Idempotent, never raises:
    a release lost to a Redis outage is done by the sweeper's `reconcile_slots`. True if a slot was freed."""
    return release_slots([(user_id, run_id)], client) == 1


@dataclass(frozen=True)
class Reconciled:
    """What one reconciliation did: live runs whose slot it refreshed, slots it re-added, slots it freed."""

    live: int
    restored: int
    freed: int


def reconcile_slots(client: redis.Redis | None = None, page: int = RECONCILE_PAGE) -> Reconciled:
    """Make the slots follow the runs' state in the database (one worker per sweep interval).

    1. Every queued/running/waiting run holds a slot: re-added if missing (a Redis wipe, a lost admit
       reply) and refreshed to now, so admit.lua's age prune never drops a live run however long it
       waits on a person or in the queue. A run that ended between the read and the write gives it
       back at once (its own release may have run before the write).
    2. Every slot in the owners index whose run ended or has no row, and that nobody admitted or
       refreshed within `SLOT_GRACE_MS`, is freed: a release lost to a Redis error or a crash.
    Pages of `page` runs, one pipeline and one database read each: cost O(live runs + slots)."""
    from checkpoints import occupancy

    s = get_settings()
    client = client or get_redis()
    ttl_ms = s.admission_ttl_s * 1000
    live = restored = freed = 0
    for rows in occupancy.occupying_pages(page):
        now = now_ms()
        pipe = client.pipeline(transaction=False)
        for run_id, user_id in rows:
            pipe.zadd(keys.user_slots(user_id), {run_id: now})
            pipe.hset(SLOT_OWNERS, run_id, user_id)
            pipe.pexpire(keys.user_slots(user_id), ttl_ms)
        restored += sum(int(added) for added in pipe.execute()[0::3])
        live += len(rows)
        found = occupancy.states([run_id for run_id, _ in rows])
        ended = [(run_id, user_id) for run_id, user_id in rows if found.get(run_id) not in occupancy.OCCUPYING_STATES]
        freed += _free(client, ended)
    cursor = 0
    while True:
        cursor, scanned = client.hscan(SLOT_OWNERS, cursor, count=page)
        entries: dict[str, str] = dict(scanned)  # type: ignore[arg-type]  # decode_responses: str
        if entries:
            found = occupancy.states(list(entries))
            gone = [(run_id, user_id) for run_id, user_id in entries.items()
                    if found.get(run_id) not in occupancy.OCCUPYING_STATES]
            if gone:
                pipe = client.pipeline(transaction=False)
                for run_id, user_id in gone:
                    pipe.zscore(keys.user_slots(user_id), run_id)
                old = now_ms() - SLOT_GRACE_MS
                freed += _free(client, [g for g, score in zip(gone, pipe.execute(), strict=True)
                                        if score is None or score < old])
        if cursor == 0:
            break
    if restored or freed:
        log.warning("admission_slots_reconciled", live=live, restored=restored, freed=freed)
    return Reconciled(live, restored, freed)


def _free(client: redis.Redis, slots: list[tuple[str, str]]) -> int:
    """Release these (run_id, user_id) slots in one round trip; returns how many were held."""
    if not slots:
        return 0
    pipe = client.pipeline(transaction=False)
    for run_id, user_id in slots:
        pipe.zrem(keys.user_slots(user_id), run_id)
        pipe.hdel(SLOT_OWNERS, run_id)
    replies = pipe.execute()
    for run_id, user_id in slots:
        log.info("admission_slot_freed", run_id=run_id, user_id=user_id)
    return sum(int(r) for r in replies[0::2])

