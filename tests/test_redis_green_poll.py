"""tasks/redis_green_poll.py: in a gevent-patched process redis-py's zero-timeout check of a pooled
connection polls in the kernel, any other poll still yields to the other greenlets, and what the check
finds is what it found before (an idle connection: nothing; a reply not read yet: data; a connection
the server closed: replaced by the pool). Each case runs in a patched child process against the real
Redis (the test process itself is not gevent-patched)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.extras import require_extra

PRELUDE = """
from gevent import monkey
monkey.patch_all()
import gevent, gevent.select, redis
import redis._parsers.hiredis as hp
from tasks.redis_green_poll import install
green_polls = []
_real = gevent.select.poll.poll
def _counted(self, *a, **k):
    green_polls.append(a)
    return _real(self, *a, **k)
gevent.select.poll.poll = _counted
"""


def _child(body: str, redis_url: str) -> str:
    code = PRELUDE + f"REDIS_URL = {redis_url!r}\n" + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.fixture
def redis_url(redis_client: object) -> str:
    require_extra("gevent")
    return "redis://127.0.0.1:6379/0"


def test_a_checkout_polls_in_the_kernel_and_finds_what_it_found_before(redis_url):
    out = _child("""
        assert install() and install()  # once; the second call finds it installed
        r = redis.Redis.from_url(REDIS_URL)
        r.set("green-poll", "1")
        pool = r.connection_pool
        for _ in range(50):
            assert r.get("green-poll") == b"1"
        assert green_polls == [], f"gevent's poll ran {len(green_polls)} times for zero-timeout checks"

        c = pool.get_connection()
        assert c.can_read() is False  # idle: nothing to read
        c.send_command("PING")  # a reply not read yet
        gevent.sleep(0.05)
        assert c.can_read() is True
        assert c.read_response() in (b"PONG", "PONG") and c.can_read() is False
        c.send_command("CLIENT", "ID")
        victim = c.read_response()
        pool.release(c)
        redis.Redis.from_url(REDIS_URL).client_kill_filter(_id=victim)  # the server closes it
        gevent.sleep(0.05)
        assert r.get("green-poll") == b"1"  # found closed and replaced
        assert r.client_id() != victim
        print("ok")
        """, redis_url)
    assert out == "ok"


def test_a_poll_that_may_wait_still_lets_the_other_greenlets_run(redis_url):
    out = _child("""
        install()
        r = redis.Redis.from_url(REDIS_URL)
        r.ping()
        ticks = []

        def ticker():
            for _ in range(200):
                ticks.append(1)
                gevent.sleep(0.005)

        gevent.spawn(ticker)
        c = r.connection_pool.get_connection()
        assert c.can_read(timeout=0.3) is False
        assert green_polls, "a poll with a timeout went to the kernel"
        print(len(ticks))
        """, redis_url)
    assert int(out) >= 20, f"the other greenlet ran {out} times while one waited 0.3 s on a poll"


def test_celeryconfig_installs_it_in_a_gevent_worker_and_nowhere_else(redis_url):
    assert _child("""
        import celeryconfig  # what a `celery -A tasks worker --pool gevent` imports, once patched
        print(getattr(hp.select, "_fenced_kernel_poll", False))
        """, redis_url) == "True"
    import redis._parsers.hiredis as hp

    from tasks.redis_green_poll import install

    assert install() is False and not hasattr(hp.select, "_fenced_kernel_poll")  # this process is not patched
