"""SQLite's one write lock: how the writers of a process wait for it (checkpoints.db's SQLite engines).

SQLite lets one transaction write at a time, database-wide, and a writer that finds the lock taken
waits in SQLite's busy handler, which sleeps 1, 2, 5, 10, 15 ... ms between looks. Under a burst (two
worker processes of four threads, `fenced bench`) that left the machine a quarter idle: writers asleep
while the lock stood free (issue 17). Instead:

- the writers of one process take turns at a lock of the process's own (`writing`): the next one wakes
  the moment the one before it has committed, and at most one writer per process waits for the
  database's lock;
- that one looks again every 0.1-0.2 ms (`begin_immediate`), not 1-100 ms; the looks cost a few
  microseconds each, and only while another process writes.

Each of the two waits is bounded by `FENCED_SQLITE_BUSY_TIMEOUT_MS`, then fails as the busy handler's
did ("database is locked": transient, so the transaction is retried, and a delivery that outlives its
retries lets its lease go), so a writer frozen inside a transaction still costs the others a bounded
wait, never a thread stuck for good. Readers take neither: in WAL mode they never wait for a writer.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

_GATE = "fenced_writer_gate"
FIRST_LOOK_S = 0.0001
LOOK_EVERY_S = 0.0002  # the most a waiter sleeps between looks


@dataclass(frozen=True)
class _Gate:
    lock: threading.Lock
    busy_s: float  # the engine's FENCED_SQLITE_BUSY_TIMEOUT_MS, as its connections' busy timeout


def install(engine: Engine, busy_s: float) -> None:
    """Give a SQLite engine its writers' gate (one per engine, in the process that made it); a writer waits
    for it at most `busy_s`, as for the database's lock."""
    setattr(engine, _GATE, _Gate(threading.Lock(), busy_s))


def busy_s(engine: Engine) -> float:
    """The bound on each wait of a writer of this SQLite engine (its FENCED_SQLITE_BUSY_TIMEOUT_MS)."""
    gate: _Gate = getattr(engine, _GATE)
    return gate.busy_s


def turn(engine: Engine, readonly: bool) -> AbstractContextManager[None]:
    """What a transaction holds around itself: a writer of a SQLite engine, its writers' gate (`writing`);
    a reader, or any transaction on an engine without a gate (MySQL/MariaDB), nothing."""
    gate: _Gate | None = getattr(engine, _GATE, None)
    return nullcontext() if readonly or gate is None else writing(gate)


@contextmanager
def writing(gate: _Gate) -> Iterator[None]:
    """Hold this process's writers' gate around a write transaction, from before it takes a pooled
    connection (a writer waiting here holds none) to after its COMMIT or ROLLBACK, waiting for it at most
    the engine's busy timeout."""
    if not gate.lock.acquire(timeout=gate.busy_s):
        raise sa.exc.OperationalError("BEGIN IMMEDIATE", None, sqlite3.OperationalError(
            f"database is locked (this process's other writers held it for {gate.busy_s:g} s)"))
    try:
        yield
    finally:
        gate.lock.release()


def begin(dbapi_conn: Any, readonly: bool, busy_s: float) -> None:
    """Begin a transaction on a pysqlite connection: a writer takes the database's write lock at once
    (`begin_immediate`), so a read-then-write never fails with "database is locked"; a reader stays
    deferred and never waits for a writer (WAL)."""
    if readonly:
        dbapi_conn.execute("BEGIN")
    else:
        begin_immediate(dbapi_conn, busy_s)


def begin_immediate(dbapi_conn: Any, busy_s: float) -> None:
    """BEGIN IMMEDIATE on a pysqlite connection, looking again every 0.1-0.2 ms for at most `busy_s`
    while another process holds the write lock; its busy timeout is set back to `busy_s` after."""
    dbapi_conn.execute("PRAGMA busy_timeout=0")  # SQLite's handler would sleep 1 ms at the first refusal
    try:
        deadline = time.monotonic() + busy_s
        delay = FIRST_LOOK_S
        while True:
            try:
                dbapi_conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise sa.exc.OperationalError("BEGIN IMMEDIATE", None, exc) from exc
            time.sleep(delay)
            delay = min(delay * 2, LOOK_EVERY_S)
    finally:
        dbapi_conn.execute(f"PRAGMA busy_timeout={int(busy_s * 1000)}")
