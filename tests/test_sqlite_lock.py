"""How writers wait for SQLite's one write lock (checkpoints.sqlite_lock), on a real SQLite file: the writers
of a process take turns at its own gate, the one waiting for another process's write looks again instead
of sleeping in SQLite's busy handler, and every wait stays bounded and transient."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from checkpoints import db, sqlite_lock
from fenced_core.errors import StoreUnavailable


@pytest.fixture
def sqlite_url(tmp_path: Path, settings_env) -> str:
    settings_env(sqlite_busy_timeout_ms=400)
    url = f"sqlite:///{tmp_path / 'lock.db'}"
    with db.transaction(url) as conn:
        conn.exec_driver_sql("CREATE TABLE t (n INTEGER)")
    return url


def _other_process_writes(path: str) -> sqlite3.Connection:
    """A connection of its own (as another process would have) holding the database's write lock."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO t VALUES (0)")
    return other


@contextmanager
def _a_writer_of_this_process_inside(url: str) -> Iterator[None]:
    """A thread ("first") of this process inside a write transaction (one row written) until the block ends."""
    inside, release = threading.Event(), threading.Event()

    def write() -> None:
        with db.transaction(url) as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
            inside.set()
            release.wait(5)

    thread = threading.Thread(target=write, name="first")
    thread.start()
    try:
        assert inside.wait(5)
        yield
    finally:
        release.set()
        thread.join(5)


def test_writers_of_one_process_take_turns_before_they_begin(sqlite_url, monkeypatch):
    """While one writer of this process is inside its transaction, the next waits at the gate: it has not
    begun (so it is not asleep in SQLite's busy handler), and it goes on once the first has committed."""
    begun: list[str] = []
    real = sqlite_lock.begin_immediate

    def recorded(c: Any, s: Any) -> Any:
        begun.append(threading.current_thread().name)
        return real(c, s)

    monkeypatch.setattr(sqlite_lock, "begin_immediate", recorded)

    def second() -> None:
        with db.transaction(sqlite_url) as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (2)")

    b = threading.Thread(target=second, name="second")
    with _a_writer_of_this_process_inside(sqlite_url):
        b.start()
        b.join(0.2)
        assert b.is_alive() and begun == ["first"], f"the second writer began while the first wrote: {begun}"
    b.join(5)
    assert begun == ["first", "second"]
    with db.transaction(sqlite_url, readonly=True) as conn:
        assert sorted(r[0] for r in conn.exec_driver_sql("SELECT n FROM t")) == [1, 2]


def test_a_reader_does_not_wait_for_this_processs_writer(sqlite_url):
    with _a_writer_of_this_process_inside(sqlite_url):
        with db.transaction(sqlite_url, readonly=True) as conn:  # would wait on the gate up to 0.4 s, then fail
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 0


def test_the_waiter_looks_again_while_another_process_writes_and_then_begins(sqlite_url, tmp_path):
    """SQLite's own handler would block the first BEGIN IMMEDIATE until the lock came free (one look);
    begin_immediate turns it off for its looks, looks again until the other writer commits, and puts the
    busy timeout back."""
    other = _other_process_writes(str(tmp_path / "lock.db"))
    threading.Timer(0.05, lambda: other.execute("COMMIT")).start()
    looks: list[str] = []
    conn = sqlite3.connect(str(tmp_path / "lock.db"), isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=400")
    conn.set_trace_callback(lambda sql: looks.append(sql) if sql == "BEGIN IMMEDIATE" else None)
    sqlite_lock.begin_immediate(conn, 0.4)
    conn.execute("INSERT INTO t VALUES (1)")
    conn.execute("COMMIT")
    assert len(looks) > 1, "it looked again instead of sleeping in SQLite's busy handler"
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 400, "the connection's busy timeout is back"


def test_each_wait_is_bounded_and_transient(sqlite_url, tmp_path):
    """Another process that never lets go (frozen inside a write) costs a bounded wait: the BEGIN fails as
    'database is locked', which transaction() reports as the database being unavailable (retried)."""
    other = _other_process_writes(str(tmp_path / "lock.db"))
    try:
        with pytest.raises(StoreUnavailable) as exc:
            with db.transaction(sqlite_url) as conn:
                conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        assert "database is locked" in str(exc.value)
        assert db.is_transient_db_error(exc.value)
    finally:
        other.execute("ROLLBACK")
    with db.transaction(sqlite_url) as conn:  # the gate was given back, and the busy timeout restored
        conn.exec_driver_sql("INSERT INTO t VALUES (2)")


def test_a_writer_of_this_process_stuck_inside_its_transaction_costs_a_bounded_wait(sqlite_url):
    with _a_writer_of_this_process_inside(sqlite_url):
        with pytest.raises(StoreUnavailable) as exc:
            with db.transaction(sqlite_url):
                pass
        assert "this process's other writers" in str(exc.value)
        assert isinstance(exc.value, sa.exc.OperationalError)


def test_the_one_query_path_waits_and_fails_as_transaction_does(sqlite_url, tmp_path):
    """raw_txn (the hot path's one-query transactions, checkpoints.sqlite_multi) waits at the same gate and
    for the same lock: bounded, reported as the store being unavailable (retried), the gate given back."""
    with _a_writer_of_this_process_inside(sqlite_url):
        with pytest.raises(StoreUnavailable) as exc, db.raw_txn(sqlite_url):
            pytest.fail("began while this process's other writer was inside its transaction")
        assert "this process's other writers" in str(exc.value)
    other = _other_process_writes(str(tmp_path / "lock.db"))
    try:
        with pytest.raises(StoreUnavailable) as exc, db.raw_txn(sqlite_url):
            pytest.fail("began while another process held the write lock")
        assert "database is locked" in str(exc.value) and db.is_transient_db_error(exc.value)
    finally:
        other.execute("ROLLBACK")
    with db.raw_txn(sqlite_url) as cur:
        cur.execute("INSERT INTO t VALUES (%s); COMMIT", (3,))
    with db.raw_txn(sqlite_url, readonly=True) as cur:
        cur.execute("SELECT n FROM t; COMMIT")
        assert sorted(cur.fetchall()) == [(1,), (3,)]  # the writer of this process committed its row
