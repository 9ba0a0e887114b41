"""Engines and transactions for the run store: MySQL/MariaDB via PyMySQL, or SQLite in WAL mode."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
import structlog
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from tenacity import RetryCallState, retry, retry_if_exception, wait_random_exponential

from checkpoints import sqlite_lock
from checkpoints.sqlite_multi import MultiCursor
from fenced_core.errors import StoreUnavailable
from fenced_core.settings import get_settings, safe_url

_lock = threading.Lock()
_engines: dict[tuple[int, str], Engine] = {}
T = TypeVar("T")
log = structlog.get_logger("checkpoints.db")


def get_engine(url: str | None = None) -> Engine:
    """The engine for `url` (default: settings) in this process; a forked child makes its own."""
    url = url or get_settings().db_url
    key = (os.getpid(), url)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = _make_engine(url)
        return engine


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        # SQLite has one write lock for the whole database, and a process stopped inside a write
        # transaction keeps it (it has no idle-transaction timeout). Each wait for it is bounded, so a
        # writer fails as transient and is retried (in_txn, db_retry) instead of sitting in the driver;
        # a delivery that outlives the retries lets its lease go and the run is rescued later.
        busy_ms = get_settings().sqlite_busy_timeout_ms
        engine = sa.create_engine(url, connect_args={"timeout": busy_ms / 1000, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # pysqlite's own deferred BEGIN off; see _begin_immediate
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute(f"PRAGMA busy_timeout={int(busy_ms)}")
            cur.close()

        # How writers wait for the database's one write lock: checkpoints.sqlite_lock.
        sqlite_lock.install(engine, busy_ms / 1000)

        @event.listens_for(engine, "begin")
        def _begin_immediate(conn: Connection) -> None:
            # A writer takes the lock at BEGIN; a reader (transaction(readonly=True)) stays deferred.
            sqlite_lock.begin(conn.connection.driver_connection,
                              conn.get_execution_options().get("fenced_readonly", False), busy_ms / 1000)

        return engine
    settings = get_settings()
    if sa.engine.make_url(url).get_driver_name() == "pymysql":
        from checkpoints.pymysql_tls import install as _share_the_preferred_tls_context

        _share_the_preferred_tls_context()  # one CA load per process, not per connection
    # No pool_pre_ping: it is a round trip before every transaction (4 per step). A connection that
    # died with the server fails its first statement instead; every write runs in `in_txn` (and
    # get_run under db_retry), which retries on the fresh connection the pool then hands out.
    engine = sa.create_engine(
        url,
        pool_pre_ping=False,
        # Every transaction() ends in COMMIT or ROLLBACK, and Connection.close() rolls back a transaction
        # still open, so the pool's own ROLLBACK on check-in is a wasted round trip per transaction.
        pool_reset_on_return=None,
        pool_recycle=3600,
        # A connection opened past the pool's size is closed when it is returned. Too small a pool
        # under a worker's threads meant a new connection (a TCP and MySQL handshake, and PyMySQL's TLS
        # context, since shared: checkpoints/pymysql_tls.py) for much of its transactions: the
        # in-flight benchmark found a quarter of a loaded worker's CPU there with 5 + 10, and 44 % of a
        # gevent worker's with 20 + 10 (2026-12-01): overflow feeds itself (connecting costs CPU, so
        # transactions run longer, so more of them overlap). Transactions last about a millisecond, so
        # 20 kept connections serve hundreds of threads; with no overflow (the default) a thread that
        # finds all in use waits for one.
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        connect_args={"connect_timeout": 5, "read_timeout": 30, "write_timeout": 30},
        isolation_level="READ COMMITTED",
    )
    idle_s = settings.db_idle_txn_timeout_s

    @event.listens_for(engine, "do_connect")
    def _multi_statements(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        # One round trip for a whole hot transaction (raw_txn): its statements and its COMMIT are sent
        # as one multi-statement query. ORed into the flags the dialect chose (FOUND_ROWS stays on:
        # rowcount counts matched rows, which the fenced writes rely on). Values are still escaped by
        # the driver; no statement is ever built from unescaped input.
        if one_trip_driver(engine):
            cparams["client_flag"] = int(cparams.get("client_flag", 0)) | _CLIENT_MULTI_STATEMENTS

    @event.listens_for(engine, "connect")
    def _bound_idle_transactions(dbapi_conn: Any, _record: Any) -> None:
        # A worker frozen (SIGSTOP, VM pause) in the middle of a transaction keeps its row locks, and
        # the worker taking the run over would wait on them for as long as the freeze lasts. MariaDB
        # rolls back a transaction idle this long and drops the session; ours never idle (no I/O inside
        # a transaction), and a killed one is retried by in_txn like any lost connection.
        if idle_s and "mariadb" in dbapi_conn.get_server_info().lower():
            cur = dbapi_conn.cursor()
            cur.execute(f"SET SESSION idle_transaction_timeout = {int(idle_s)}")
            cur.close()

    return engine


_CLIENT_MULTI_STATEMENTS = 1 << 16  # the MySQL protocol's CLIENT_MULTI_STATEMENTS (PyMySQL and mysqlclient)
ONE_TRIP_DRIVERS = ("pymysql", "mysqldb")


def one_trip_driver(engine: Engine) -> bool:
    """Whether this engine's hot transactions go through raw_txn as one multi-statement query each:
    MySQL/MariaDB through PyMySQL or mysqlclient (one round trip), and SQLite through pysqlite, which runs
    the same query statement by statement (checkpoints.sqlite_multi: no SQLAlchemy work per statement)."""
    if engine.dialect.name == "sqlite":
        return engine.dialect.driver == "pysqlite"
    return engine.dialect.name == "mysql" and engine.dialect.driver in ONE_TRIP_DRIVERS


def one_trip(url: str | None = None) -> bool:
    """one_trip_driver for the store at `url` (default: settings)."""
    return one_trip_driver(get_engine(url))


def dispose_all() -> None:
    """Drop this process's engines (tests; or after a fork, the parent's pool must not be shared)."""
    with _lock:
        for (pid, _url), engine in list(_engines.items()):
            if pid == os.getpid():
                engine.dispose()
            del _engines[(pid, _url)]


# A store without its schema answers with an OperationalError too, but waiting cannot fix it.
_MISSING_SCHEMA = ("no such table", "doesn't exist")


def is_missing_schema(exc: BaseException) -> bool:
    """The store has no tables yet (a fresh SQLite file, a new database): `fenced migrate` fixes it."""
    return isinstance(exc, sa.exc.DBAPIError) and any(m in str(exc.orig) for m in _MISSING_SCHEMA)


# MySQL/MariaDB errors that say the connection settings are wrong, not that the server is away, so no
# retry can help: access denied to the database (1044), for the user (1045; 1698 without a password),
# no such database (1049). Also the codes mysqlclient reports.
_CONFIG_ERRORS = frozenset({1044, 1045, 1049, 1698})


def is_config_error(exc: BaseException) -> bool:
    """The server refused the connection's settings (user, password, database name): FENCED_DB_URL is wrong."""
    args: tuple[Any, ...] = getattr(getattr(exc, "orig", None), "args", ())
    return isinstance(exc, sa.exc.DBAPIError) and bool(args) and args[0] in _CONFIG_ERRORS


def refused_message(exc: BaseException, what: str = "refused the connection") -> str:
    """What the CLI and a refusing worker say about a store error that no retry helps (the URL with its
    password masked): a config error, or (`what`) another error that was never retried."""
    return (f"the run store {safe_url(get_settings().db_url)} {what}: "
            f"{getattr(exc, 'orig', None) or exc} (check FENCED_DB_URL)")


def is_transient_db_error(exc: BaseException) -> bool:
    """Connection-level failures (server restarting, dropped socket, deadlock/lock wait): worth retrying.

    The boundary's test: `transaction()` turns exactly these into DatabaseUnavailable, so code above
    checkpoints catches StoreUnavailable instead of asking this."""
    if isinstance(exc, StoreUnavailable):
        return True
    if is_missing_schema(exc) or is_config_error(exc):
        return False
    if isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)):
        return True
    return isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated


class DatabaseUnavailable(StoreUnavailable, sa.exc.OperationalError):
    """The run database could not be reached, or failed transiently (a restart, a dropped socket, a lock
    wait past its bound). Raised by `transaction()` in place of the driver's error (kept as __cause__);
    also an OperationalError, so handlers written against SQLAlchemy still match. The transaction it
    ended rolled back, or committed whole if only the reply was lost: fenced writes are idempotent."""

    def __init__(self, exc: sa.exc.DBAPIError) -> None:
        sa.exc.OperationalError.__init__(self, exc.statement, exc.params, exc.orig,  # type: ignore[arg-type]
                                         hide_parameters=exc.hide_parameters,
                                         connection_invalidated=exc.connection_invalidated)
        self.driver_error = exc

    def __reduce__(self) -> Any:  # picklable across processes, like the driver's own errors
        return type(self), (self.driver_error,)


# A process at a prompt (the CLI) gives up sooner than a worker; set in that process only, never through
# the environment, which the workers it starts (`fenced chaos`, `fenced demo`, `fenced worker`) inherit.
_retry_window_s: float | None = None


def set_retry_window(seconds: float) -> None:
    """Retry transient database errors for `seconds` in this process (default: settings.db_retry_s)."""
    global _retry_window_s
    _retry_window_s = seconds


def retry_window_s() -> float:
    return _retry_window_s if _retry_window_s is not None else get_settings().db_retry_s


def _retry_window_over(state: RetryCallState) -> bool:
    # Read at each attempt: a worker rides out a restart (db_retry_s, 60 s), the CLI gives up sooner.
    return (state.seconds_since_start or 0) >= retry_window_s()


def _log_retry(state: RetryCallState) -> None:
    """Say that a transaction is retried, and why (the chaos db-restart scenario looks for this line)."""
    exc = state.outcome.exception() if state.outcome else None
    log.warning("db_retry", attempt=state.attempt_number, fn=getattr(state.fn, "__qualname__", "?"),
                sleep_s=round(state.upcoming_sleep, 3), error=repr(exc)[:300])


_tenacity_retry = retry(
    retry=retry_if_exception(is_transient_db_error),
    wait=wait_random_exponential(multiplier=0.1, max=2),
    stop=_retry_window_over,
    before_sleep=_log_retry,
    reraise=True,
)


def db_retry(fn: Callable[..., T]) -> Callable[..., T]:
    """Retry a whole transaction on transient database errors for up to `db_retry_s` (60 s in workers).

    Trades latency for riding out a database restart; only for transactions whose writes are idempotent
    (absolute values, fenced by epoch), because a commit whose reply was lost is retried too. The first
    attempt runs outside tenacity (its bookkeeping cost ~0.03 ms of CPU per transaction, a few per
    step); a transient failure is logged (`db_retry`, as every retry is) and handed to the tenacity loop,
    whose first attempt comes at once (a pooled connection that died with the server is replaced). The
    tenacity wrapper is built only then: in_txn and in_raw_txn decorate a fresh function per call."""

    @functools.wraps(fn)
    def first_then_retry(*args: Any, **kwargs: Any) -> T:
        started = time.monotonic()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not is_transient_db_error(exc):
                raise
            log.warning("db_retry", attempt=1, fn=getattr(fn, "__qualname__", "?"), sleep_s=0.0,
                        error=repr(exc)[:300])
        try:
            return _tenacity_retry(fn)(*args, **kwargs)
        except Exception as exc:
            setattr(exc, _RETRIED_S, time.monotonic() - started)
            raise

    return first_then_retry


_RETRIED_S = "fenced_retried_s"


def retried_s(exc: BaseException) -> float | None:
    """How long the transaction that raised `exc` was tried, first attempt to last failure (None: it was
    not retried). Longer than the retry window when each attempt waits itself (SQLite's busy timeout)."""
    value = getattr(exc, _RETRIED_S, None)
    return value if isinstance(value, float) else None


_in_txn = threading.local()


def in_transaction() -> bool:
    """Whether this thread is inside `transaction()` (hooks refuse to run there)."""
    return getattr(_in_txn, "depth", 0) > 0


@contextmanager
def transaction(url: str | None = None, readonly: bool = False) -> Iterator[Connection]:
    """One transaction on the store; functions that take its connection end in `_txn`.

    The boundary for driver errors: a transient one (is_transient_db_error) leaves as
    DatabaseUnavailable, whether it came from the connect, a statement or the commit."""
    _in_txn.depth = getattr(_in_txn, "depth", 0) + 1
    try:
        engine = get_engine(url)
        # SQLite's writers take turns before they take a pooled connection (checkpoints.sqlite_lock): a
        # writer waiting for its turn holds none.
        with sqlite_lock.turn(engine, readonly), engine.connect() as conn:
            if readonly:
                conn = conn.execution_options(fenced_readonly=True)
            with conn.begin():
                yield conn
    except sa.exc.DBAPIError as exc:
        if isinstance(exc, StoreUnavailable) or not is_transient_db_error(exc):
            raise
        raise DatabaseUnavailable(exc) from exc
    finally:
        _in_txn.depth -= 1


def in_txn(fn: Callable[..., T], *args: Any, url: str | None = None, **kwargs: Any) -> T:
    """Run `fn(conn, *args, **kwargs)` in one transaction, retried as a whole on transient errors."""

    @db_retry
    def attempt() -> T:
        with transaction(url) as conn:
            return fn(conn, *args, **kwargs)

    return attempt()


@contextmanager
def raw_txn(url: str | None = None, readonly: bool = False) -> Iterator[Any]:
    """One transaction on a pooled DBAPI connection, for the hot path's multi-statement queries: yields a
    cursor; the caller sends its statements AND its COMMIT (usually in one query), and reads every
    result. On any exception the transaction is rolled back (a broken connection is discarded instead)
    and a driver error leaves as DatabaseUnavailable when transient, as transaction() does.

    Only for one_trip stores; the caller's statements must be fenced each on its own (a multi-statement
    query runs on to its COMMIT whatever the first statement matched). On SQLite the cursor is a
    checkpoints.sqlite_multi.MultiCursor in a transaction begun as transaction() begins one (a writer
    takes its turn and BEGIN IMMEDIATE; a `readonly` one a deferred BEGIN)."""
    engine = get_engine(url)
    dbapi_error = engine.dialect.loaded_dbapi.Error
    sqlite = engine.dialect.name == "sqlite"
    _in_txn.depth = getattr(_in_txn, "depth", 0) + 1
    try:
        with sqlite_lock.turn(engine, readonly):
            conn = engine.raw_connection()
            try:
                cur: Any
                if sqlite:
                    sqlite_lock.begin(conn.driver_connection, readonly, sqlite_lock.busy_s(engine))
                    cur = MultiCursor(conn.driver_connection)
                else:
                    cur = conn.cursor()
                try:
                    yield cur
                finally:
                    cur.close()
            except BaseException as exc:
                invalidated = isinstance(exc, dbapi_error) and engine.dialect.is_disconnect(
                    exc, conn.dbapi_connection, None)
                if invalidated:
                    conn.invalidate(exc)
                else:
                    try:
                        conn.rollback()
                    except Exception as rollback_exc:  # the connection is unusable: never hand it out again
                        conn.invalidate(rollback_exc)
                raise
            finally:
                conn.close()
    except sa.exc.DBAPIError as exc:  # SQLite's writers' turn or BEGIN IMMEDIATE (checkpoints.sqlite_lock)
        if isinstance(exc, StoreUnavailable) or not is_transient_db_error(exc):
            raise
        raise DatabaseUnavailable(exc) from exc
    except dbapi_error as exc:
        wrapped = sa.exc.DBAPIError.instance(
            None, None, exc, dbapi_error, connection_invalidated=engine.dialect.is_disconnect(exc, None, None))
        if isinstance(wrapped, sa.exc.DBAPIError) and is_transient_db_error(wrapped):
            raise DatabaseUnavailable(wrapped) from exc
        raise wrapped from exc
    finally:
        _in_txn.depth -= 1


def results(cur: Any) -> list[tuple[int, Any, list[Any]]]:
    """Every result of the multi-statement query just executed on `cur`, in order: (rowcount, lastrowid,
    rows). Reading them all surfaces an error in any statement (the server stops at the first error,
    before the COMMIT that ends the query)."""
    out = [(cur.rowcount, cur.lastrowid, list(cur.fetchall()) if cur.description else [])]
    while cur.nextset():
        out.append((cur.rowcount, cur.lastrowid, list(cur.fetchall()) if cur.description else []))
    return out


def in_raw_txn(fn: Callable[..., T], *args: Any, url: str | None = None, **kwargs: Any) -> T:
    """Run `fn(cursor, *args, **kwargs)` in raw_txn, retried as a whole on transient errors (db_retry:
    only for idempotent transactions, as in_txn)."""

    @db_retry
    def attempt() -> T:
        with raw_txn(url) as cur:
            return fn(cur, *args, **kwargs)

    return attempt()


# The newest revision in checkpoints/migrations/versions (tests/test_migrations.py keeps the two equal).
HEAD_REVISION = "0006"


def schema_revision(engine: Engine) -> str | None:
    """The revision Alembic recorded in this database; None when it has none (or cannot be read).

    A read (on SQLite a deferred transaction, as transaction(readonly=True) takes): it must not wait for
    the write lock, or a writer holding it would make a store already at head look unversioned."""
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(fenced_readonly=True)
            return conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    except sa.exc.DBAPIError:
        return None


def migrate(url: str | None = None) -> None:
    """Bring the schema to head with Alembic (MySQL: under a named lock, so workers can race safely).

    A database already at head costs one SELECT: every worker start calls this, and loading Alembic and
    its scripts to find nothing to do took ~0.15 s idle (more on a loaded machine), a restarted worker's
    time before it takes over anything."""
    url = url or get_settings().db_url
    engine = get_engine(url)
    if schema_revision(engine) == HEAD_REVISION:
        return
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if engine.dialect.name == "mysql":
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT GET_LOCK('fenced_migrate', 60)")
            try:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
                conn.commit()
            finally:
                conn.exec_driver_sql("SELECT RELEASE_LOCK('fenced_migrate')")
    else:
        with engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
