"""FencedRedis: a redis.Redis whose driver errors (a connection error, a timeout) leave as RedisUnavailable,
from any command, script or pipeline. fencing.connection builds the process's client on it (and re-exports
these names); the Sentinel client (fencing.sentinel) builds on it too, without importing fencing.connection,
which dispatches to it (no import cycle)."""

from __future__ import annotations

from typing import Any

import redis
from redis.client import Pipeline

from fenced_core.errors import StoreUnavailable


class RedisUnavailable(StoreUnavailable, redis.ConnectionError):
    """Redis could not be reached or did not answer in time. Also a redis.ConnectionError, so handlers
    written against redis-py still match. A command that raised it may or may not have run: every
    fenced write to Redis is a compare-and-set or an absolute value, safe to repeat."""


_DRIVER_ERRORS = (redis.ConnectionError, redis.TimeoutError)


def translate_driver_error(exc: Exception) -> Exception:
    """A driver error (connection, timeout) as the RedisUnavailable fenced raises for it."""
    if isinstance(exc, StoreUnavailable):
        return exc
    return RedisUnavailable(f"Redis unavailable: {type(exc).__name__}: {exc}")


class FencedPipeline(Pipeline):
    """A pipeline whose driver errors leave as RedisUnavailable."""

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return super().execute(raise_on_error)
        except _DRIVER_ERRORS as exc:
            raise translate_driver_error(exc) from exc

    def immediate_execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return super().immediate_execute_command(*args, **options)
        except _DRIVER_ERRORS as exc:
            raise translate_driver_error(exc) from exc


class FencedRedis(redis.Redis):
    """redis.Redis whose driver errors leave as RedisUnavailable (commands, scripts, pipelines)."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute_command(*args, **options)
        except _DRIVER_ERRORS as exc:
            raise translate_driver_error(exc) from exc

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> FencedPipeline:
        return FencedPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
