"""The Redis side of the metrics: queue depths, admitted-unsent runs, the dead-letter stream, fast-takeover false
positives and lease renew failures, read in one round trip per Redis (never written)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fencing import keys
from fencing.broker import get_broker_redis
from fencing.connection import get_redis


@dataclass(frozen=True)
class RedisGauges:
    """What Redis says now, cluster-wide: undelivered wake-ups per queue, runs admitted but not yet sent,
    notices in the capped dead-letter stream, holders presumed dead that were alive (keys.FALSE_POSITIVES),
    and the lease renewals every watchdog missed (keys.RENEW_FAILURES, summed over processes)."""

    queue_depth: dict[str, int]
    admitted_unsent: int
    dead_letter_stream: int
    false_positives: int
    renew_failures: int


def read_gauges(queues: Sequence[str]) -> RedisGauges:
    """One pipeline to the broker (queue lengths) and one to fenced's Redis (the rest). Raises
    RedisUnavailable when either is down: the caller reports the store down, never zeros. A Redis that
    lost its data reads as zeros; Prometheus takes a counter that went down as a reset."""
    pipe = get_broker_redis().pipeline(transaction=False)
    for queue in queues:
        pipe.llen(keys.broker_queue(queue))
    lengths = pipe.execute()
    pipe = get_redis().pipeline(transaction=False)
    pipe.zcard(keys.ADMITTED_UNSENT)
    pipe.xlen(keys.DEAD_LETTERS)
    pipe.get(keys.FALSE_POSITIVES)
    pipe.hvals(keys.RENEW_FAILURES)
    unsent, dead, false_positives, failures = pipe.execute()
    return RedisGauges({q: int(n) for q, n in zip(queues, lengths, strict=True)}, int(unsent), int(dead),
                       int(false_positives or 0), sum(int(n) for n in failures))
