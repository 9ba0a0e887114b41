"""The per-process Redis client: created lazily after fork, connections named after the worker token."""

from __future__ import annotations

import os
import socket
import threading
import uuid

import redis

from fenced_core.settings import get_settings

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
    return redis.Redis.from_url(
        settings.redis_url,
        client_name=name,
        socket_timeout=5,
        socket_connect_timeout=5,
        health_check_interval=30,
        decode_responses=True,
    )


def reset() -> None:
    """Forget the client (tests, or settings changed)."""
    with _lock:
        _state.pop("client", None)
        _state.pop("client_pid", None)
