"""What a real worker writes at each FENCED_LOG_LEVEL: at `warning` none of the three info lines a step
(`running`, `step_done`, `delivery_done`), and still the warnings: a dropped duplicate wake-up, which
`bench.inflight` counts from its workers' logs (they run at `warning`). Real worker, Redis, MariaDB."""

from __future__ import annotations

import pytest

from checkpoints import runs
from fencing import keys
from tasks import submit_run, wakeup
from tests.workers_fixture import wait_for, wait_terminal


@pytest.mark.parametrize("level, step_lines", [("warning", False), ("info", True)])
def test_a_worker_writes_its_step_lines_only_at_info_and_a_dropped_duplicate_at_either(
        workers, redis_client, level, step_lines):
    w = workers.start(f"logs-{level}", FENCED_LOG_LEVEL=level)
    run_id = submit_run("alice", "buy headphones")
    [done] = wait_terminal([run_id], timeout=30)
    assert done.state == "done"
    # Another process holds the run's lease: a wake-up for it is a duplicate, refused by the lease.
    redis_client.set(keys.lease(run_id), "other-host:1:abc/def", px=30_000)
    wakeup.send(run_id, done.step, "continuation")
    wait_for(lambda: "event='duplicate_dropped'" in w.logs(), 20, "the duplicate to be dropped")
    redis_client.delete(keys.lease(run_id))
    logs = w.logs()
    for line in ("event='running'", "event='step_done'", "event='delivery_done'"):
        assert (line in logs) is step_lines, (level, line)
    assert runs.get_run(run_id) == done, "the dropped wake-up changed nothing"
