"""Test setup: real Redis and real MariaDB (started by scripts/services.sh when down), SQLite too."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MYSQL_URL = os.environ.get("FENCED_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/fenced_test")
REDIS_URL = os.environ.get("FENCED_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

# Short leases keep the suite fast; every worker process the tests start inherits these.
TEST_ENV = {
    "FENCED_REDIS_URL": REDIS_URL,
    "FENCED_DB_URL": MYSQL_URL,
    "FENCED_LEASE_TTL_MS": "2000",
    "FENCED_HEARTBEAT_MS": "500",
    "FENCED_REAPER_TICK_MS": "250",
    "FENCED_SWEEPER_INTERVAL_MS": "1000",
    "FENCED_SWEEPER_GRACE_MS": "4000",
    "FENCED_STUB_STEP_MS": "200",
    "FENCED_RETRY_BASE_MS": "50",
    "FENCED_FAULTS_ENABLED": "1",
    "FENCED_STUB_COUNT_PAID": "1",
}
os.environ.update(TEST_ENV)
# Only now anything of ours: importing it reads the settings (cached for the process), and the Celery app
# its broker URL, so an earlier import would point this process at the default Redis and database
# whatever FENCED_TEST_REDIS_URL / FENCED_TEST_MYSQL_URL say (tests/test_conftest_env.py).
import examples.shopping  # noqa: E402, F401  (registers the demo agent: tests deliver runs in this process too)


def _services_up() -> bool:
    import redis
    import sqlalchemy as sa

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
        sa.create_engine(MYSQL_URL.rsplit("/", 1)[0] + "/").connect().close()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session", autouse=True)
def services() -> None:
    """Redis and MariaDB must be real and running: start them if they are not. The test database starts
    empty each session: a session interrupted mid-migration (a table created, its revision not
    recorded) must not fail the next one."""
    if not _services_up():
        subprocess.run(["bash", str(ROOT / "scripts" / "services.sh")], check=True)
    name = MYSQL_URL.rsplit("/", 1)[1].split("?")[0]
    assert name.replace("_", "").isalnum(), f"FENCED_TEST_MYSQL_URL names an odd database: {name!r}"
    subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-e",
                    f"DROP DATABASE IF EXISTS `{name}`; CREATE DATABASE `{name}`"], check=True)


def use_db(url: str) -> None:
    """Point this process at `url` and bring its schema to head."""
    from checkpoints.db import dispose_all, migrate
    from fenced_core.settings import get_settings

    os.environ["FENCED_DB_URL"] = url
    get_settings.cache_clear()
    dispose_all()
    migrate()


def wipe_tables() -> None:
    from checkpoints.db import transaction
    from checkpoints.schema import metadata
    from examples.shopping.schema import metadata as shopping_metadata

    with transaction() as conn:
        for table in [*reversed(metadata.sorted_tables), *reversed(shopping_metadata.sorted_tables)]:
            conn.execute(table.delete())


@pytest.fixture
def settings_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Set FENCED_* settings in this process for one test: settings_env(max_runs_per_user=2, ...); the
    core's and the shopping example's (stub_step_ms, model, card_ttl_s, ...) alike."""
    from examples.shopping.settings import get_shopping_settings
    from fenced_core.settings import get_settings

    def set_(**values: object) -> None:
        for name, value in values.items():
            monkeypatch.setenv(f"FENCED_{name.upper()}", str(value))
        get_settings.cache_clear()
        get_shopping_settings.cache_clear()

    yield set_
    monkeypatch.undo()
    get_settings.cache_clear()
    get_shopping_settings.cache_clear()


@pytest.fixture
def redis_client() -> Iterator[object]:
    from fencing.connection import get_redis

    client = get_redis()
    client.flushall()
    yield client


@pytest.fixture(params=["mysql", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path, redis_client: object) -> Iterator[str]:
    """The run store on MariaDB and on SQLite (WAL), each test starting empty."""
    url = MYSQL_URL if request.param == "mysql" else f"sqlite:///{tmp_path / 'store.db'}"
    use_db(url)
    wipe_tables()
    yield request.param
    use_db(MYSQL_URL)


@pytest.fixture
def mysql_store(redis_client: object) -> Iterator[str]:
    use_db(MYSQL_URL)
    wipe_tables()
    yield "mysql"
pytest_plugins = ["tests.workers_fixture"]
