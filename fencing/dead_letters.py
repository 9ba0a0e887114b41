"""The dead-letter stream: a capped Redis stream of dead-lettered runs, for operators who tail it.

The database's dead_letters table is the record (a replay reads it); this stream is a notice that may
be lost with Redis, and is capped at `dead_letter_keep` entries."""

from __future__ import annotations

import redis

from fenced_core.settings import get_settings
from fencing import keys
from fencing.connection import get_redis
from fencing.lease import now_ms


def add(run_id: str, step: int, reason: str, attempts: int, client: redis.Redis | None = None) -> str:
    """Add one dead-lettered run to the stream (trimmed exactly to `dead_letter_keep`); returns its id.
    Raises RedisUnavailable when Redis is down: the caller decides whether the notice matters."""
    entry = {"run_id": run_id, "step": str(step), "reason": reason, "attempts": str(attempts), "at_ms": str(now_ms())}
    return str((client or get_redis()).xadd(keys.DEAD_LETTERS, entry,  # type: ignore[arg-type]
                                            maxlen=get_settings().dead_letter_keep, approximate=False))


def newest(count: int = 10, client: redis.Redis | None = None) -> list[dict[str, str]]:
    """The newest `count` entries, newest first (operators and tests)."""
    entries: list[tuple[str, dict[str, str]]] = (client or get_redis()).xrevrange(  # type: ignore[assignment]
        keys.DEAD_LETTERS, count=count)
    return [fields for _id, fields in entries]
