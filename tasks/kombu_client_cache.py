"""Every Celery publish reuses one redis-py client per kombu channel instead of building a new one.

Measured with kombu 5.7.0 / redis-py 8.1 (issue 17): kombu's Redis channel builds a `redis.Redis` for
every publish (`Channel.conn_or_acquire()` -> `_create_client()`), and redis-py's constructor copies its
~200 response callbacks into a fresh case-insensitive dict each time. A fenced step publishes its
continuation and (with task events on) a task-sent event: two clients, about 0.3-0.4 ms of CPU per step.

A `redis.Redis` over a connection pool holds no connection of its own (each command borrows one from the
pool), so one client per channel and pool serves every publish that channel makes. The cached client is
rebuilt whenever the channel's pool changes (kombu drops its pools on a disconnect, and a Sentinel
channel's pool is the current master's), so it never outlives the pool it was made for. The asynchronous
client (the consumer's BRPOP) is left to kombu. Remove this module once kombu reuses its client.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

_PATCHED = "_fenced_client_cache"


def install() -> None:
    """Patch kombu's Redis channel (the Sentinel channel inherits it) once per process."""
    channel = kombu_redis.Channel
    if getattr(channel, _PATCHED, False):
        return
    original = channel._create_client

    def _create_client(self: Any, asynchronous: bool = False) -> Any:
        if asynchronous:
            return original(self, asynchronous)
        pool = self.pool
        cached = self.__dict__.get(_PATCHED)
        if cached is None or cached.connection_pool is not pool:
            cached = original(self, asynchronous)
            self.__dict__[_PATCHED] = cached
        return cached

    channel._create_client = _create_client  # type: ignore[method-assign]
    setattr(channel, _PATCHED, True)
