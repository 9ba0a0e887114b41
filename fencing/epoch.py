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


def mirrors(run_ids: list[str], client: redis.Redis | None = None, chunk: int = 1_000) -> dict[str, int]:
    """run_id -> the mirror, for the runs that have one (a wiped Redis has none), in pipelined GETs of
    `chunk` keys: one round trip per chunk; on a Cluster the pipeline splits them by node."""
    client = client or get_redis()
    found: dict[str, int] = {}
    for start in range(0, len(run_ids), chunk):
        part = run_ids[start:start + chunk]
        pipe = client.pipeline(transaction=False)
        for run_id in part:
            pipe.get(keys.epoch(run_id))
        for run_id, value in zip(part, pipe.execute(), strict=True):
            if value is not None:
                found[run_id] = int(value)
    return found
