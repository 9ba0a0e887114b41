"""A real local Redis Cluster for tests (scripts/redis-cluster.sh, 3 masters + 3 replicas), and fixtures that
point this process at it: fenced's Redis on the cluster, the Celery broker on the plain test Redis (kombu
has no Cluster transport). CI runs them: the fixture starts the cluster (idempotent) on
FENCED_TEST_CLUSTER_PORT..+5 (default 7000)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import REDIS_URL, ROOT

CLUSTER_PORT = int(os.environ.get("FENCED_TEST_CLUSTER_PORT", "7000"))
SCRIPT = ROOT / "scripts" / "redis-cluster.sh"


def cluster_url(base: int = CLUSTER_PORT) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{base + i}" for i in range(3))


@pytest.fixture(scope="session")
def redis_cluster() -> str:
    """Start the local cluster (or leave it running) and return its URL."""
    subprocess.run(["bash", str(SCRIPT), "start", str(CLUSTER_PORT)], check=True, timeout=120,
                   capture_output=True)
    return cluster_url()


def point_at(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    """fenced's Redis at `redis_url`, the broker at the plain test Redis, in this process (and the workers
    it starts, which inherit its environment)."""
    from fenced_core.settings import get_settings
    from fencing import connection

    monkeypatch.setenv("FENCED_REDIS_URL", redis_url)
    monkeypatch.setenv("FENCED_BROKER_URL", REDIS_URL)
    get_settings.cache_clear()
    connection.reset()


@pytest.fixture
def on_cluster(redis_cluster: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """This test on the cluster: fenced's client is a FencedRedisCluster, every master flushed first (and
    the broker's plain Redis, as `redis_client` flushes it on one Redis)."""
    import redis

    from fenced_core.settings import get_settings
    from fencing import connection

    point_at(monkeypatch, redis_cluster)
    redis.Redis.from_url(REDIS_URL).flushall()
    client = connection.get_redis()
    client.flushall()
    yield client
    monkeypatch.undo()
    get_settings.cache_clear()
    connection.reset()
