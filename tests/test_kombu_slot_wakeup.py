"""tasks/kombu_slot_wakeup.py: a green worker's consumer whose slots are all taken takes the next message
as soon as one frees, not when kombu's poll times out (up to 2 s later). A real `celery -A tasks worker
--pool gevent -c 1` works through a backlog; real Redis and MariaDB.

Not tested at kombu's level: a bare kombu consumer (no Celery loop) keeps its finished BRPOP socket
readable and spins instead of waiting, so it does not show the wait a worker has.
"""

from __future__ import annotations

import pytest

from checkpoints import ledger
from tasks import submit_run
from tests.extras import require_extra
from tests.workers_fixture import wait_terminal


@pytest.mark.chaos
def test_a_one_slot_gevent_worker_works_through_a_backlog_without_waiting_between_runs(workers):
    """Zero-latency runs on `-P gevent -c 1`: each delivery ends in a few tenths of a second, so five runs
    take about a second; with the consumer waiting out its 2 s poll after each, they took 8 s or more."""
    require_extra("gevent")
    workers.start("g1", pool="gevent", concurrency=1, FENCED_STUB_STEP_MS="0", FENCED_STUB_TOOL_MS="0")
    run_ids = [submit_run(f"user-{i}", f"buy item {i}") for i in range(5)]
    done = wait_terminal(run_ids, timeout=120)
    assert [r.state for r in done] == ["done"] * 5, [(r.state, r.error) for r in done]
    claims = sorted(e.at_ms for run_id in run_ids for e in ledger.history(run_id) if e.kind == "claimed")
    finished = max(r.finished_at_ms for r in done)
    assert len(claims) >= 5
    span_s = (finished - claims[0]) / 1000
    assert span_s < 5.0, f"five zero-latency runs took {span_s:.1f} s from the first claim to the last finish"
