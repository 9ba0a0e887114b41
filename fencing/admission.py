"""Admission: one Lua step admits a run under the global backlog and per-user limits, or refuses it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis
import structlog

from fenced.errors import AdmissionRefused
from fenced.settings import get_settings
from fencing import keys
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


@dataclass(frozen=True)
class Admission:
    """An admitted run and what it counted against."""

    run_id: str
    user_id: str
    waiting: int  # undelivered + admitted-not-sent runs, this one included
    user_runs: int  # the user's admitted, unfinished runs, this one included


def admit(run_id: str, user_id: str, queues: Sequence[str], client: redis.Redis | None = None) -> Admission:
    """Take a slot for `run_id` or raise AdmissionRefused (nothing taken). `queues`: where new runs wait.

    Redis unreachable refuses too ("unavailable"): the broker is usually that same Redis, so the
    wake-up could not be sent either."""
    s = get_settings()
    client = client or get_redis()
    list_keys = [keys.broker_queue(q) for q in queues]
    try:
        outside = 0
        if not shares_redis():
            # Another Redis cannot be read inside the script: counted just before, a little less exact.
            pipe = get_broker_redis().pipeline(transaction=False)
            for key in list_keys:
                pipe.llen(key)
            outside, list_keys = sum(pipe.execute()), []
        ok, limit, count, extra = scripts_for(client)(
            "admit", [keys.ADMITTED_UNSENT, keys.user_slots(user_id), *list_keys],
            [run_id, now_ms(), s.max_queued_runs, s.max_runs_per_user, s.admission_ttl_s * 1000,
             UNSENT_TTL_MS, outside],
        )
    except redis.RedisError as exc:
        raise AdmissionRefused("unavailable", RETRY_AFTER_UNAVAILABLE_S,
                               f"admission refused: the limits could not be checked ({exc!r}); "
                               f"retry in {RETRY_AFTER_UNAVAILABLE_S:g} s") from exc
    if ok:
        return Admission(run_id, user_id, waiting=int(count), user_runs=int(extra))
    if limit == "user":
        retry = max(min(RETRY_AFTER_USER_S, int(extra) / 1000), 0.1)  # extra: ms until the oldest slot is pruned
        message = (f"admission refused: user {user_id!r} has {count} unfinished runs "
                   f"(limit max_runs_per_user={s.max_runs_per_user}); retry in {retry:g} s")
    else:
        retry = RETRY_AFTER_GLOBAL_S
        message = (f"admission refused: {count} runs are waiting to start "
                   f"(limit max_queued_runs={s.max_queued_runs}); retry in {retry:g} s")
    log.info("admission_refused", run_id=run_id, user_id=user_id, limit=limit, count=int(count))
    raise AdmissionRefused(str(limit), retry, message)


def mark_sent(run_id: str, client: redis.Redis | None = None) -> None:
    """The first wake-up went out (or failed and the sweeper owns it): stop counting it as unsent."""
    try:
        (client or get_redis()).zrem(keys.ADMITTED_UNSENT, run_id)
    except redis.RedisError as exc:  # pruned after UNSENT_TTL_MS anyway
        log.warning("admission_mark_sent_failed", run_id=run_id, error=repr(exc))


def release_slot(user_id: str, run_id: str, client: redis.Redis | None = None) -> bool:
    """Give the user's slot back (the run ended, or was never created). Idempotent, never raises:
    a release lost to a Redis outage is pruned after `admission_ttl_s`. True if a slot was freed."""
    try:
        pipe = (client or get_redis()).pipeline(transaction=True)
        pipe.zrem(keys.user_slots(user_id), run_id)
        pipe.zrem(keys.ADMITTED_UNSENT, run_id)
        freed, _ = pipe.execute()
    except redis.RedisError as exc:
        log.warning("admission_release_failed", run_id=run_id, user_id=user_id, error=repr(exc))
        return False
    return bool(freed)
