"""Paid model calls, counted where the runtime never writes: by the model (the stub; any test model).

The run row records the calls the runtime checkpointed; this counter records the calls a provider
would have billed. The history checker (harness.history) holds one against the other, so a paid call
the runtime lost or made twice cannot hide behind a row that agrees with itself.
"""

from __future__ import annotations

import redis

from fencing import keys
from fencing.connection import get_redis

# Kept a week: long enough for any check after a run, short enough to clean up after itself.
PAID_KEEP_S = 7 * 24 * 3600


def count_paid_call(run_id: str, epoch: int, step: int, client: redis.Redis | None = None) -> None:
    """Count one model call a provider would bill, for `step` of `run_id` under holder `epoch`."""
    pipe = (client or get_redis()).pipeline(transaction=False)
    pipe.hincrby(keys.paid_calls(run_id), f"{epoch}:{step}", 1)
    pipe.expire(keys.paid_calls(run_id), PAID_KEEP_S)
    pipe.execute()


def paid_calls(run_id: str, client: redis.Redis | None = None) -> dict[tuple[int, int], int]:
    """{(epoch, step): paid calls} for one run."""
    raw: dict[str, str] = (client or get_redis()).hgetall(keys.paid_calls(run_id))  # type: ignore[assignment]
    out = {}
    for field, n in raw.items():
        epoch, step = field.split(":")
        out[(int(epoch), int(step))] = int(n)
    return out
