"""The broker's Redis, where kombu keeps the queue lists: fenced's own client unless FENCED_BROKER_URL differs."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

import redis

from fenced_core.settings import get_settings
from fencing.connection import client_for, get_redis
from fencing.lease import Lease
from fencing.sentinel import BROKER_SCHEME, client_for_target, parse_broker_url

if TYPE_CHECKING:
    from fencing.events import Appends

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
            client = _clients[key] = _client_for_broker(url)
        return client


def _client_for_broker(url: str) -> redis.Redis:
    """A plain broker URL is a Redis URL; kombu's sentinel:// list goes through Sentinel (fencing.sentinel)."""
    if url.startswith(BROKER_SCHEME):
        target = parse_broker_url(url, get_settings().broker_master_name)
        return client_for_target(target, socket_timeout=5, socket_connect_timeout=5, decode_responses=True)
    return client_for(url)


def waiting(queue: str) -> int:
    """Messages waiting in `queue`'s list on the broker (one LLEN)."""
    from fencing import keys

    return int(get_broker_redis().llen(keys.broker_queue(queue)))


def renewed_with_none_waiting(lease: Lease, queue: str, appends: Appends | None = None) -> bool:
    """Renew `lease` and tell whether no message waits in `queue` on the broker: True only when both hold
    (a lease not renewed is lost: `lease.lost`). One round trip when the broker is fenced's Redis (the
    LLEN rides with the renewal, which then happens either way); otherwise the LLEN first, on its own.
    `appends` ride with the renewal (Lease.renew), when it is sent: `appends.ids` says whether they went."""
    from fencing import keys

    if not shares_redis():
        return not waiting(queue) and lease.renew(appends=appends)[0]
    renewed, count = lease.renew(llen=keys.broker_queue(queue), appends=appends)
    return renewed and not count


def renewed_and_going_on(lease: Lease, queue: str, slot_free: bool, appends: Appends | None = None) -> bool:
    """Renew `lease` and tell whether the delivery may run its run's next step itself: True when renewed
    and either no message waits in `queue`, or this process has a slot free (`slot_free`: its worker takes
    waiting wake-ups itself) and no rescue is under way (keys.RESCUES_UNDER_WAY: a rescued run's wake-up
    waits behind everyone's inline steps on a loaded worker, so while rescues go out every delivery
    yields to what waits, as with no slot free). One round trip, two while a rescue is under way.
    `appends` (the step's step_done event) ride with the first renewal sent: `appends.ids` says whether
    they went; a refused one raises FencedOut."""
    from fencing import keys

    if slot_free:
        renewed, rescuing = lease.renew(exists=keys.RESCUES_UNDER_WAY, appends=appends)
        if not renewed or not rescuing:
            return renewed
        appends = None  # sent
    return renewed_with_none_waiting(lease, queue, appends)
