"""fencing.round_trip: a pipeline's queued commands in one round trip on a pooled connection, replying as
redis-py's Pipeline.execute does, and never handing a connection with unread replies back to the pool.
Real Redis throughout."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from fencing import round_trip, scripts
from fencing.connection import RedisUnavailable, client_for, get_redis
from fencing.scripts import scripts_for
from tests.conftest import REDIS_URL

# A script that keeps Redis busy for ~`ARGV[1]` ms, then replies "late".
_BUSY = ("local t0 = redis.call('TIME'); local stop = t0[1] * 1000000 + t0[2] + ARGV[1] * 1000; "
         "while true do local t = redis.call('TIME'); if t[1] * 1000000 + t[2] >= stop then break end end; "
         "return 'late'")


def _queue_mixed(pipe: redis.client.Pipeline, sha: str) -> None:
    pipe.execute_command("EVALSHA", sha, 1, "rt:lease", "tok", 5000)
    pipe.zadd("rt:index", {"m": 10})
    pipe.zadd("rt:index", {"m": 5}, gt=True)
    pipe.zadd("rt:index", {"m": 20}, gt=True)
    pipe.set("rt:s", "é[b]x[/b]")
    pipe.get("rt:s")
    pipe.exists("rt:s", "rt:none")
    pipe.llen("rt:none")
    pipe.sadd("rt:set", "a", "b")
    pipe.srem("rt:set", "a")
    pipe.incr("rt:s")  # WRONGTYPE-like error: not an integer
    pipe.zscore("rt:index", "m")


def test_replies_are_the_pipelines_reply_for_reply(redis_client):
    """The same queued commands, once through Pipeline.execute and once through exchange on a fresh
    keyspace: every reply equal (callbacks applied: ZADD's count, SET's True, ZSCORE's float, EXISTS's
    count), an error reply in place, and the bytes of a non-ASCII value exact."""
    sha = scripts_for(redis_client)._scripts["renew"].sha
    redis_client.script_load(scripts.source("renew"))

    expected_pipe = redis_client.pipeline(transaction=False)
    _queue_mixed(expected_pipe, sha)
    expected = expected_pipe.execute(raise_on_error=False)
    redis_client.flushall()
    redis_client.script_load(scripts.source("renew"))

    pipe = redis_client.pipeline(transaction=False)
    _queue_mixed(pipe, sha)
    got = round_trip.exchange(redis_client, pipe.command_stack, raise_on_error=False)

    assert len(got) == len(expected) == 12
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if isinstance(e, Exception):
            assert type(g) is type(e), (i, g, e)
        else:
            assert g == e and type(g) is type(e), (i, g, e)
    assert got[4] is True and got[5] == "é[b]x[/b]" and got[11] == 20.0
    assert isinstance(got[10], redis.ResponseError)


def test_an_error_reply_is_raised_when_asked_and_the_connection_stays_in_step(redis_client):
    pipe = redis_client.pipeline(transaction=False)
    pipe.set("rt:k", "v")
    pipe.incr("rt:k")
    pipe.get("rt:k")
    with pytest.raises(redis.ResponseError):
        round_trip.exchange(redis_client, pipe.command_stack)
    # Every reply was read: the next round trip on the (one) pooled connection reads its own.
    pipe = redis_client.pipeline(transaction=False)
    pipe.set("rt:k2", "w")
    pipe.get("rt:k2")
    assert round_trip.exchange(redis_client, pipe.command_stack) == [True, "w"]


def test_a_failure_mid_read_never_hands_back_a_connection_with_replies_unread(redis_client):
    """A reply callback raises after the first reply while the second (a busy script's) is still on its way:
    that connection must be dropped, not pooled, or the next round trip on it would read the busy
    script's "late" as its own reply."""
    client = client_for(REDIS_URL, max_connections=1)  # one connection: the next round trip gets it back

    def refuse(_reply, **_options):
        raise ValueError("callback refused")

    client.set_response_callback("GET", refuse)
    pipe = client.pipeline(transaction=False)
    pipe.get("rt:a")
    pipe.execute_command("EVAL", _BUSY, 0, 300)
    with pytest.raises(ValueError, match="callback refused"):
        round_trip.exchange(client, pipe.command_stack)
    client.set("rt:b", "b's value")
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("HGET", "rt:none", "f")
    pipe.execute_command("STRLEN", "rt:b")
    assert round_trip.exchange(client, pipe.command_stack) == [None, len("b's value")]
    client.close()


def test_a_dropped_connection_is_reconnected_by_the_clients_retry(redis_client):
    """The server closed our pooled connection (CLIENT KILL): the exchange reconnects and is sent again,
    as Pipeline.execute does under the client's retry policy."""
    client = client_for(REDIS_URL, max_connections=1, client_name="rt-victim")
    client.ping()
    killed = redis_client.client_kill_filter(_type="normal", skipme=True, laddr=None,
                                             _id=next(c["id"] for c in redis_client.client_list()
                                                      if c.get("name") == "rt-victim"))
    assert killed == 1
    pipe = client.pipeline(transaction=False)
    pipe.set("rt:after", "1")
    pipe.get("rt:after")
    assert round_trip.exchange(client, pipe.command_stack) == [True, "1"]
    client.close()


def test_redis_down_is_redis_unavailable():
    client = client_for("redis://127.0.0.1:6399/0", socket_connect_timeout=0.5,
                        retry=Retry(NoBackoff(), 0))
    pipe = client.pipeline(transaction=False)
    pipe.get("x")
    with pytest.raises(RedisUnavailable):
        round_trip.exchange(client, pipe.command_stack)


def test_a_timed_out_reply_is_redis_unavailable_and_the_next_round_trip_reads_its_own(redis_client):
    """A reply that does not come within the socket timeout: RedisUnavailable (no retries configured);
    the connection is dropped, so the next round trip, once Redis is free again, reads its own reply."""
    client = client_for(REDIS_URL, max_connections=1, socket_timeout=0.1, retry=Retry(NoBackoff(), 0))
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("EVAL", _BUSY, 0, 400)
    with pytest.raises(RedisUnavailable):
        round_trip.exchange(client, pipe.command_stack)
    time.sleep(0.5)
    pipe = client.pipeline(transaction=False)
    pipe.set("rt:t", "mine")
    pipe.get("rt:t")
    assert round_trip.exchange(client, pipe.command_stack) == [True, "mine"]
    client.close()


def test_non_plain_arguments_are_packed_by_redis_py(redis_client):
    """A float or a two-word command goes through the connection's own packer (encoded as redis-py
    encodes it); plain str/bytes/int through hiredis directly: the same bytes on the wire."""
    conn = redis_client.connection_pool.get_connection()
    try:
        plain = [(("EVALSHA", "ab", 1, "k", 5, b"x", "é"), {})]
        assert b"".join(round_trip.pack(conn, plain)) == b"".join(conn.pack_commands([plain[0][0]]))
        mixed = [(("ZADD", "k", 1.5, "m"), {}), (("SCRIPT EXISTS", "ab"), {})]
        assert b"".join(round_trip.pack(conn, mixed)) == b"".join(conn.pack_commands([a for a, _o in mixed]))
    finally:
        redis_client.connection_pool.release(conn)
    pipe = redis_client.pipeline(transaction=False)
    pipe.zadd("rt:f", {"m": 1.5})
    pipe.zscore("rt:f", "m")
    assert round_trip.exchange(redis_client, pipe.command_stack) == [1, 1.5]


def test_threads_sharing_the_pool_each_read_their_own_replies(redis_client):
    """Many threads, one client: every exchange gets its own connection and its own replies."""
    client = get_redis()
    wrong: list[tuple[int, list[object]]] = []

    def work(n: int) -> None:
        for i in range(50):
            pipe = client.pipeline(transaction=False)
            pipe.set(f"rt:th:{n}", f"{n}:{i}")
            pipe.get(f"rt:th:{n}")
            got = round_trip.exchange(client, pipe.command_stack)
            if got != [True, f"{n}:{i}"]:
                wrong.append((n, got))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
