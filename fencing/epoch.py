"""The Redis mirror of a run's epoch: raised after each claim, never lowered; Redis writes check it."""

from __future__ import annotations

import redis

from fencing import keys, scripts
from fencing.connection import get_redis
from fencing.scripts import scripts_for


def raise_epoch(run_id: str, epoch: int, client: redis.Redis | None = None) -> int:
    """Raise the mirror to `epoch`; returns the mirror afterwards (higher = a newer claim exists)."""
    client = client or get_redis()
    return int(scripts_for(client)(scripts.raise_epoch(run_id, epoch=epoch)))


def current(run_id: str, client: redis.Redis | None = None) -> int | None:
    value = (client or get_redis()).get(keys.epoch(run_id))
    return int(value) if value is not None else None
