"""`celery -A tasks worker --pool gevent` (the `gevent` extra): runs finish, and nothing binds the
blocking socket or select.

Before the fix a gevent worker froze after its first claims: gevent's patching walks every live object
to swap existing locks, an `isinstance` on one of Celery's lazy proxies loaded the default app's
configuration, and `celeryconfig` (with kombu and redis-py behind it) was imported half-way through the
patching, keeping the blocking `select.select`. kombu's Redis poller then blocked the whole process for
its 1 s timeouts in a loop. Real worker processes, real Redis and MariaDB.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from checkpoints import ledger
from fencing import events
from harness.verdict import FINAL_EVENT_GRACE_S, read_stream
from harness.workers import REPO_ROOT
from tasks import submit_run
from tests.extras import require_extra
from tests.workers_fixture import wait_terminal

# What `celery -A tasks worker --pool gevent` does before it loads the app (celery/__main__.py), then the
# app itself; prints what kombu's poller and redis-py's connections will call.
_PROBE = """
import sys
sys.argv = ["celery", "-A", "tasks", "worker", "--pool", "gevent"]
from celery import maybe_patch_concurrency
maybe_patch_concurrency()
import select
import tasks, kombu.utils.eventio as eventio, redis.connection as rc
import gevent.select, gevent.socket
print(eventio._selectf is gevent.select.select, rc.socket.socket is gevent.socket.socket,
      select.select is gevent.select.select)
"""


def test_the_gevent_worker_binds_geventss_select_and_socket():
    require_extra("gevent")
    out = subprocess.run([sys.executable, "-c", _PROBE],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True", "True"], (
        "kombu's poller or redis-py kept the blocking select/socket (imported during the patching)", out.stdout)


@pytest.mark.chaos
def test_runs_finish_on_a_gevent_worker(workers):
    require_extra("gevent")
    workers.start("g", pool="gevent", concurrency=20)
    run_ids = [submit_run(f"user-{i}", f"buy item {i}") for i in range(6)]
    done = wait_terminal(run_ids, timeout=90)
    assert [r.state for r in done] == ["done"] * 6, [(r.state, r.error) for r in done]
    for run_id in run_ids:
        kinds = [e.kind for e in ledger.history(run_id)]
        assert "lease_lost" not in kinds and "takeover" not in kinds, kinds
        view = events.live_view(read_stream(run_id, "done", FINAL_EVENT_GRACE_S))  # the event follows the row
        assert [e.type for e in view].count("run_done") == 1
