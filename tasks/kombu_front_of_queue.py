"""A message with the `fenced_front` header goes to the consuming end of its queue's Redis list.

kombu's Redis transport LPUSHes every message and its consumers BRPOP from the other end, so a message
waits behind everything already in the list. A rescue's wake-up (a dead or frozen holder's run) should
not: under load a dead worker's hundreds of runs were rescued just after the other runs' steps had
handed over together, and waited behind those handovers on the continuation queue (issue 17: takeover
p95 ~6-8 s with 1,000 runs in flight). With this header kombu RPUSHes it instead, so the next BRPOP of
the queue takes it; everything else still queues in arrival order. Order is never part of the protocol
(any copy of a wake-up may arrive at any time; the run row decides), so this moves latency only.

The patch covers both of kombu 5.7's put paths (a single publish and a publish batch, which the reaper's
and liveness ticks use), on the Redis channel and the Sentinel channel that inherits it. A queue with a
message TTL (`x-expires`) keeps kombu's own path. Remove this module if kombu grows a way to say it.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

HEADER = "fenced_front"
_PATCHED = "_fenced_front_of_queue"


def install() -> None:
    """Patch kombu's Redis channel once per process."""
    channel = kombu_redis.Channel
    if getattr(channel, _PATCHED, False):
        return
    original = channel._put

    def _put(self: Any, queue: str, message: dict[str, Any], **kwargs: Any) -> Any:
        if not (message.get("headers") or {}).get(HEADER) or (self._expires and queue in self._expires):
            return original(self, queue, message, **kwargs)
        key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        publish_batch = kwargs.pop("_publish_batch", None)
        if publish_batch is not None:
            publish_batch.add("rpush", key, dumps(message))
            return None
        with self.conn_or_acquire() as client:
            client.rpush(key, dumps(message))
        return None

    channel._put = _put  # type: ignore[method-assign]
    setattr(channel, _PATCHED, True)
