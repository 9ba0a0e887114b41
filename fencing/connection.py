"""The per-process Redis client: created lazily after fork, connections named after the worker token.

The boundary for Redis driver errors: a connection error or a timeout leaves our clients as
RedisUnavailable (a StoreUnavailable), from any command, script or pipeline."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from typing import Any

import redis

from fenced_core.settings import CLUSTER_SCHEME, SENTINEL_SCHEME, get_settings
from fencing.fenced_redis import FencedPipeline, FencedRedis, RedisUnavailable

__all__ = ["CLIENT_NAME_PREFIX", "FencedPipeline", "FencedRedis", "RedisUnavailable", "client_for", "get_redis",
           "process_token", "reset"]

_lock = threading.RLock()
CLIENT_NAME_PREFIX = "fenced:"  # CLIENT SETNAME fenced:<process token> on every pooled connection
_state: dict[str, object] = {}


def process_token() -> str:
    """This process's identity as a lease holder: host, pid and a nonce (pids are reused)."""
    pid = os.getpid()
    with _lock:
        if _state.get("token_pid") != pid:
            _state["token_pid"] = pid
            host = socket.gethostname().replace(" ", "_")  # the token is also a client name
            _state["token"] = f"{host}:{pid}:{uuid.uuid4().hex[:8]}"
        return str(_state["token"])


def client_for(url: str, **options: Any) -> redis.Redis:
    """A client for `url` (decoded responses, 5 s socket timeouts unless `options` say otherwise):
    a FencedRedis for redis://, rediss:// and unix://; the cluster and Sentinel schemes go to their
    own modules, which return clients with the same error translation."""
    options = {"socket_timeout": 5, "socket_connect_timeout": 5, "decode_responses": True, **options}
    if url.startswith(CLUSTER_SCHEME):
        from fencing.cluster import cluster_client_for

        # Not a redis.Redis subclass, but the same command API for everything fenced sends (keyed
        # commands, scripts, non-transactional pipelines); fencing.cluster.is_cluster tells them apart.
        return cluster_client_for(url, **options)  # type: ignore[return-value]
    if url.startswith(SENTINEL_SCHEME):
        from fencing.sentinel import sentinel_client_for

        return sentinel_client_for(url, **options)
    return FencedRedis.from_url(url, **options)


def connected_names(client: redis.Redis) -> set[str]:
    """The names of every client connection the store has now (CLIENT LIST). On a Redis Cluster, of
    every node: a process's connections are spread over the nodes it talked to, so it is connected if
    any node lists one (a dead process has none anywhere)."""
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        per_node: Any = client.client_list(target_nodes=RedisCluster.ALL_NODES)
        lists = per_node.values() if isinstance(per_node, dict) else [per_node]
        return {c.get("name", "") for found in lists for c in found}
    return {c.get("name", "") for c in client.client_list()}


def get_redis() -> redis.Redis:
    """A client for this process; every pooled connection carries CLIENT SETNAME <worker token>."""
    pid = os.getpid()
    with _lock:
        client = _state.get("client")
        if client is None or _state.get("client_pid") != pid:
            client = _make_client()
            _state["client"], _state["client_pid"] = client, pid
        return client  # type: ignore[return-value]


def _make_client() -> redis.Redis:
    settings = get_settings()
    name = CLIENT_NAME_PREFIX + process_token()
    return client_for(settings.redis_url, client_name=name, health_check_interval=30,
                      max_connections=settings.redis_max_connections)


def reset() -> None:
    """Forget the client (tests, or settings changed)."""
    with _lock:
        _state.pop("client", None)
        _state.pop("client_pid", None)
