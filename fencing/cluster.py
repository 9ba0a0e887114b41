"""fenced's Redis on a Redis Cluster: a redis-py RedisCluster with FencedRedis's error translation.

`redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]` names any of the cluster's nodes (redis-py
discovers the rest). Per-run keys share their `{run_id}` hash tag and every script touches one slot
(fencing.keys); pipelines here are never transactions across slots (redis-py splits a pipeline by node
and sends the parts in parallel, so commands of one pipeline on different slots are not ordered). The
Celery broker is never a Cluster: kombu's Redis transport has no Cluster support.

Failover: a killed master's slots answer with connection errors, CLUSTERDOWN, TRYAGAIN or MOVED until
its replica is promoted (after cluster-node-timeout); redis-py retries and refreshes its slot map, and
what is still failing after its retries leaves as RedisUnavailable (a StoreUnavailable), as with one Redis.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    ReadOnlyError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)

from fenced_core.errors import StoreUnavailable
from fenced_core.settings import CLUSTER_SCHEME
from fencing.fenced_redis import RedisUnavailable

# Driver errors that mean "the cluster could not answer now" (a node down, a failover in progress, a slot
# moving): MovedError is an AskError. A CROSSSLOT error is not here: it is a bug, and stays one.
_DRIVER_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError, redis.TimeoutError, ClusterDownError, ClusterError, TryAgainError, AskError,
    SlotNotCoveredError, ReadOnlyError)


# At start-up redis-py says "no node answered" with a RedisClusterException.
_CONNECT_ERRORS: tuple[type[Exception], ...] = (RedisClusterException, *_DRIVER_ERRORS)


def _unavailable(exc: Exception) -> Exception:
    if isinstance(exc, StoreUnavailable):
        return exc
    return RedisUnavailable(f"Redis Cluster unavailable: {type(exc).__name__}: {exc}")


class FencedClusterPipeline(ClusterPipeline):
    """A cluster pipeline whose driver errors leave as RedisUnavailable."""

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return super().execute(raise_on_error)
        except _DRIVER_ERRORS as exc:
            raise _unavailable(exc) from exc


class FencedRedisCluster(RedisCluster):
    """RedisCluster whose driver errors leave as RedisUnavailable (commands, scripts, pipelines)."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)
        except _DRIVER_ERRORS as exc:
            raise _unavailable(exc) from exc

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> FencedClusterPipeline:
        pipe = super().pipeline(transaction, shard_hint)
        # Same object, our execute: redis-py builds the pipeline from this client's private state, which
        # a subclass should not copy by hand.
        pipe.__class__ = FencedClusterPipeline
        return pipe


def nodes_of(url: str) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """The (host, port) startup nodes of a redis+cluster:// URL and its credentials (username, password)."""
    if not url.startswith(CLUSTER_SCHEME):
        raise ValueError(f"not a Redis Cluster URL (expected {CLUSTER_SCHEME}HOST:PORT[,HOST:PORT…]): {url!r}")
    rest = url[len(CLUSTER_SCHEME):]
    creds: dict[str, str] = {}
    if "@" in rest:
        userinfo, rest = rest.rsplit("@", 1)
        user, _, password = userinfo.partition(":")
        if user:
            creds["username"] = unquote(user)
        if password:
            creds["password"] = unquote(password)
    hosts = rest.split("/", 1)[0].split("?", 1)[0]
    nodes = []
    for part in filter(None, hosts.split(",")):
        parsed = urlsplit(f"//{part}")
        if not parsed.hostname:
            raise ValueError(f"Redis Cluster URL {url!r}: node {part!r} has no host")
        nodes.append((parsed.hostname, parsed.port or 6379))
    if not nodes:
        raise ValueError(f"Redis Cluster URL {url!r} names no node")
    return nodes, creds


# Options of a plain client that a cluster client has no use for (one connection per node is redis-py's
# choice there, not ours).
_PLAIN_ONLY = ("single_connection_client",)


def cluster_client_for(url: str, **options: Any) -> FencedRedisCluster:
    """A FencedRedisCluster for `url`: decoded responses, timeouts and the client name as `options` say
    (fencing.connection.client_for passes them on). Raises RedisUnavailable when no node answers."""
    nodes, creds = nodes_of(url)
    for name in _PLAIN_ONLY:
        options.pop(name, None)
    options.update(creds)
    try:
        return FencedRedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes], **options)
    except _CONNECT_ERRORS as exc:
        raise _unavailable(exc) from exc


def is_cluster(client: object) -> bool:
    """Is `client` a cluster client or pipeline (commands split by slot)? Asked per class once: RedisCluster's
    isinstance goes through typing's protocol check, and the hot path asks for every script it queues."""
    kind = type(client)
    found = _CLUSTER_CLASSES.get(kind)
    if found is None:
        found = _CLUSTER_CLASSES[kind] = issubclass(kind, RedisCluster)
    return found


_CLUSTER_CLASSES: dict[type, bool] = {}
