"""Connection pools sized for a worker with hundreds of threads (issue 17's in-flight benchmark found both):
fenced's Redis client lets a process open as many connections as its threads use at once (redis-py 8
caps a pool at 100 and fails the command past it), and the database pool keeps the connections a burst
opened instead of closing all but five (each new one costs a handshake and ~5 ms of CPU)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from sqlalchemy import event as sa_event

from checkpoints import db
from fencing import connection


def _at_once(n: int, work: Callable[[], object]) -> list[BaseException]:
    """Run `work` on `n` threads started together; the exceptions they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def one() -> None:
        start.wait()
        try:
            work()
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errors


@pytest.fixture
def fresh_client(settings_env, redis_client):
    def make(**settings: object):
        settings_env(**settings)
        connection.reset()
        return connection.get_redis()

    yield make
    connection.reset()


def test_150_threads_each_holding_a_redis_connection_all_get_one(fresh_client):
    client = fresh_client()
    # Each BLPOP holds its connection for 0.3 s: 150 at once need 150 connections.
    errors = _at_once(150, lambda: client.blpop(["fenced-test:pool:nothing"], timeout=0.3))
    assert errors == []


def test_the_redis_connection_limit_is_the_setting(fresh_client):
    client = fresh_client(redis_max_connections=5)
    errors = _at_once(12, lambda: client.blpop(["fenced-test:pool:nothing"], timeout=0.3))
    assert errors and all(isinstance(e, connection.RedisUnavailable) for e in errors), errors


def test_the_database_pool_keeps_what_a_burst_opened(settings_env, mysql_store):
    settings_env(db_pool_size=12, db_max_overflow=3)
    db.dispose_all()
    try:
        engine = db.get_engine()
        held = threading.Barrier(12)

        def hold() -> None:
            with db.raw_txn() as cur:
                cur.execute("SELECT 1")
                cur.fetchall()
                held.wait(10)  # all 12 checked out together
                cur.execute("COMMIT")

        assert _at_once(12, hold) == []
        assert (engine.pool.size(), engine.pool.checkedin()) == (12, 12), "the burst's connections are kept"
    finally:
        db.dispose_all()


def test_a_burst_beyond_the_pool_waits_for_a_kept_connection(settings_env, mysql_store):
    """By default no connection is opened past db_pool_size (one opened and closed per transaction
    was 44 % of a loaded gevent worker's CPU): 30 threads through a pool of 6 all finish, on 6
    connections opened once."""
    settings_env(db_pool_size=6)
    db.dispose_all()
    try:
        engine = db.get_engine()
        opened: list[int] = []
        sa_event.listen(engine, "connect", lambda *_: opened.append(1))

        def txn() -> None:
            with db.raw_txn() as cur:
                cur.execute("SELECT SLEEP(0.05)")
                cur.fetchall()
                cur.execute("COMMIT")

        assert _at_once(30, txn) == []
        assert len(opened) == 6 and engine.pool.checkedin() == 6, (len(opened), engine.pool.status())
    finally:
        db.dispose_all()


def test_the_broker_channel_serves_as_many_commands_at_once_as_a_worker_runs(redis_client):
    """kombu's Redis channel capped its pool at 10, and a loaded worker's acks (one channel, hundreds of
    deliveries) failed past it with MaxConnectionsError; Celery took that for a lost broker, reconnected
    and requeued every unacked wake-up (issue 17, 2026-12-02: 645 duplicate deliveries in one run)."""
    from tasks.celery_app import app

    with app.connection_for_read() as conn:
        channel = conn.default_channel

        def hold() -> None:
            with channel.conn_or_acquire() as client:  # what QoS.ack and a publish go through
                client.blpop(["fenced-test:pool:nothing"], timeout=0.3)

        assert _at_once(64, hold) == []


def test_every_thread_sends_through_the_one_result_backend_the_app_built():
    """A gevent worker runs each delivery on a new greenlet (a thread to Celery); `send_task` reads
    `app.backend` even though fenced keeps no results, and Celery builds a backend per thread unless
    `result_backend_thread_safe` (~240 us each: an entry-point scan). Built once, reused by every thread."""
    from tasks.celery_app import app

    first = app.backend
    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(app.backend)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [first] * 3


def test_a_process_loads_the_ca_certificates_once_not_per_mariadb_connection(mysql_store, monkeypatch):
    """PyMySQL's preferred-TLS mode built an SSL context (the system's CA certificates, ~36 ms of CPU)
    for each connection; a restarted worker opening its pool under load spent over a second there.
    Every connection of the process now gets the one context (checkpoints/pymysql_tls.py)."""
    import pymysql.connections

    db.dispose_all()
    try:
        engine = db.get_engine()
        first = engine.raw_connection()
        built: list[object] = []
        real = pymysql.connections.ssl.create_default_context
        monkeypatch.setattr(pymysql.connections.ssl, "create_default_context",
                            lambda *a, **k: built.append(a) or real(*a, **k))
        more = [engine.raw_connection() for _ in range(3)]
        contexts = {id(c.driver_connection.ctx) for c in [first, *more]}
        assert built == [] and len(contexts) == 1, (built, contexts)
        assert all(c.driver_connection.ssl for c in more), "still preferred TLS: tried if the server offers it"
        for c in [first, *more]:
            c.close()
    finally:
        db.dispose_all()


def test_tls_options_in_the_url_still_get_a_context_of_their_own():
    from pymysql.connections import Connection

    from checkpoints.pymysql_tls import install

    install()
    preferred = Connection._create_ssl_ctx(None, {})
    assert Connection._create_ssl_ctx(None, {}) is preferred
    own = Connection._create_ssl_ctx(None, {"verify_mode": False})
    assert own is not preferred and Connection._create_ssl_ctx(None, {"verify_mode": False}) is not own
