"""The broker's Redis, where kombu keeps the queue lists: fenced's own client unless FENCED_BROKER_URL differs."""

from __future__ import annotations

import os
import threading

import redis

from fenced_core.settings import get_settings
from fencing.connection import client_for, get_redis

_lock = threading.Lock()
_clients: dict[tuple[int, str], redis.Redis] = {}


def shares_redis() -> bool:
    """True when the broker is fenced's Redis (the default): scripts may read the queue lists atomically."""
    s = get_settings()
    return s.effective_broker_url == s.redis_url


def get_broker_redis() -> redis.Redis:
    """A client for the broker's Redis in this process (fenced's own client when they are the same)."""
    if shares_redis():
        return get_redis()
    url = get_settings().effective_broker_url
    key = (os.getpid(), url)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = client_for(url)
        return client
