"""fenced's Redis (and the broker's, for fenced's own reads) through Redis Sentinel.

`redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER_NAME/DB` names the sentinels, the monitored master and
the database. The client asks a sentinel for the master's address whenever it opens a connection, so
after a failover every new connection goes to the promoted replica; connections to the old master
break (refused, reset, or READONLY once it comes back demoted: redis-py turns that into a connection
error) and are replaced on their next use. Driver errors leave as RedisUnavailable, exactly as from
FencedRedis: while no master is known (a failover in progress) every command raises it, and the
paths that retry RedisUnavailable ride the failover out.

Kombu's broker URL for the same deployment is `sentinel://HOST:PORT;sentinel://HOST:PORT…` with
the master named in FENCED_BROKER_MASTER_NAME (celeryconfig passes it to kombu as `master_name`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from fenced_core.errors import ConfigError
from fenced_core.settings import SENTINEL_SCHEME
from fencing.fenced_redis import FencedRedis

BROKER_SCHEME = "sentinel://"  # kombu's: one `sentinel://HOST:PORT[/DB]` per sentinel, joined by ';'
# How long one sentinel may take to answer "who is the master?" before the next one is asked.
SENTINEL_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class SentinelTarget:
    """Where a Sentinel-managed Redis is: the sentinels to ask, the master's name, the database."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int


def parse_url(url: str) -> SentinelTarget:
    """`redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER_NAME[/DB]` (DB 0 when left out)."""
    if not url.startswith(SENTINEL_SCHEME):
        raise ConfigError(f"not a Sentinel URL (expected {SENTINEL_SCHEME}HOST:PORT[,HOST:PORT…]/MASTER_NAME/DB): "
                          f"{url!r}")
    rest = url[len(SENTINEL_SCHEME):]
    hosts, _, path = rest.partition("/")
    parts = [unquote(p) for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise ConfigError(f"a Sentinel URL names its master after the sentinels: "
                          f"{SENTINEL_SCHEME}HOST:PORT[,HOST:PORT…]/MASTER_NAME/DB, got {url!r}")
    db = parts[1] if len(parts) == 2 else "0"
    if not db.isdigit():
        raise ConfigError(f"the database of a Sentinel URL is a number: {url!r}")
    return SentinelTarget(tuple(_host_port(h, url) for h in hosts.split(",")), parts[0], int(db))


def parse_broker_url(url: str, master_name: str) -> SentinelTarget:
    """Kombu's `sentinel://HOST:PORT[/DB][;sentinel://HOST:PORT…]` (the database from the first one)."""
    urls = [u.strip() for u in url.split(";") if u.strip()]
    if not urls or not all(u.startswith(BROKER_SCHEME) for u in urls):
        raise ConfigError(f"not a Sentinel broker URL (sentinel://HOST:PORT;sentinel://HOST:PORT…): {url!r}")
    if not master_name:
        raise ConfigError("a sentinel:// broker needs FENCED_BROKER_MASTER_NAME (the master the sentinels monitor)")
    sentinels = tuple(_host_port(urlsplit(u).netloc, url) for u in urls)
    path = urlsplit(urls[0]).path.strip("/")
    return SentinelTarget(sentinels, master_name, int(path) if path.isdigit() else 0)


def _host_port(hostport: str, url: str) -> tuple[str, int]:
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"each sentinel is HOST:PORT: {hostport!r} in {url!r}")
    return host.strip("[]"), int(port)


def sentinel_client_for(url: str, **options: Any) -> redis.Redis:
    """A FencedRedis on the master `url` names, found through its sentinels (see the module doc)."""
    return client_for_target(parse_url(url), **options)


def client_for_target(target: SentinelTarget, **options: Any) -> redis.Redis:
    single = bool(options.pop("single_connection_client", False))
    options.setdefault("retry", Retry(ExponentialWithJitterBackoff(), 3))  # as redis.Redis's own default
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs={
        "socket_timeout": SENTINEL_TIMEOUT_S, "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        "decode_responses": True})
    pool = SentinelConnectionPool(target.master_name, sentinel, db=target.db, is_master=True, **options)
    return FencedRedis(connection_pool=pool, single_connection_client=single)


def master_address(target: SentinelTarget) -> tuple[str, int] | None:
    """The master's address as the first sentinel that answers reports it (None: no sentinel knows one)."""
    for host, port in target.sentinels:
        try:
            with redis.Redis(host, port, socket_timeout=SENTINEL_TIMEOUT_S,
                             socket_connect_timeout=SENTINEL_TIMEOUT_S, decode_responses=True) as client:
                addr = client.sentinel_get_master_addr_by_name(target.master_name)
        except (redis.ConnectionError, redis.TimeoutError):
            continue
        if addr:
            return str(addr[0]), int(addr[1])
    return None
