"""A worker survives its broker's Redis going away (a Sentinel failover) instead of exiting.

Measured with Celery 5.7.0 / kombu 5.7.0 (docs/redis-sentinel.md): when the broker's master dies, Celery's
consumer detaches the kombu transport from its connection (`collect()`), then closes the connection;
closing the channel restores the unacknowledged messages, which builds a new Redis pool from the
connection's parameters, read from `self.connection.client`, by then None. The AttributeError is not a
connection error, so Celery treats it as unrecoverable and the worker exits (17 of 20 worker-failovers
in the full-scale Sentinel chaos run).

The fix here is the narrowest one: reading the parameters of a detached transport raises a Redis
ConnectionError, one of the transport's connection errors, which kombu's close path already ignores; the
consumer then reconnects as it does when nothing goes wrong. The messages that could not be restored
stay in kombu's unacked hash (returned after `visibility_timeout`): for fenced a message is a wake-up
call, and the reaper and the sweeper wake every run that needs it anyway. Remove this module once
kombu/Celery fix the close path (tests/test_sentinel.py's failover scenario counts worker exits)."""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis

_PATCHED = "_fenced_detached_guard"


def install() -> None:
    """Guard kombu's Redis channels (the Sentinel channel inherits it) once per process."""
    channel = kombu_redis.Channel
    if getattr(channel, _PATCHED, False):
        return
    original = channel._connparams

    def _connparams(self: Any, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            raise redis.ConnectionError("the broker connection is closed (its kombu transport was detached)")
        return original(self, asynchronous)

    channel._connparams = _connparams  # type: ignore[method-assign]
    setattr(channel, _PATCHED, True)
