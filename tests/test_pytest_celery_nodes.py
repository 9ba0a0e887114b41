"""The chaos nodes are pytest-celery's own classes (CeleryTestSetup, CeleryTestWorker, CeleryTestBroker) over
local processes: pytest-celery's node code drives real `celery worker` process groups and the real Redis."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pytest_celery import CeleryBrokerCluster, CeleryTestBroker, CeleryTestSetup, CeleryTestWorker, CeleryWorkerCluster

from chaos.harness import ChaosConfig, Cluster, wait_terminal
from checkpoints import runs
from fenced_core.settings import get_settings
from harness.history import check_history
from tasks import submit_run


def test_a_local_setup_is_pytest_celerys_and_survives_a_kill(mysql_store: str, tmp_path: Path) -> None:
    cluster = Cluster(ChaosConfig(lease_ms=2000, step_ms=300, tool_ms=100, log_dir=tmp_path))
    try:
        cluster.start(2)
        setup = cluster.setup()
        assert isinstance(setup, CeleryTestSetup)
        assert isinstance(setup.worker_cluster, CeleryWorkerCluster) and len(setup.worker_cluster) == 2
        assert all(isinstance(w, CeleryTestWorker) for w in setup.worker_cluster)
        assert isinstance(setup.broker_cluster, CeleryBrokerCluster) and isinstance(setup.broker, CeleryTestBroker)
        assert setup.backend is None and len(setup) == 3  # fenced keeps no Celery results
        assert setup.broker.config()["url"] == get_settings().effective_broker_url

        # pytest-celery's readiness: every node's adapter, and a control ping answered by the real workers
        assert setup.ready(control=True, docker=True)
        node = setup.worker
        assert node.app is setup.app  # set on every node by ready()
        replies = setup.app.control.ping(destination=[node.hostname()], timeout=5)
        assert [list(r) for r in replies] == [[node.hostname()]]
        node.assert_log_exists("ready.", timeout=1)
        node.assert_log_does_not_exist("Traceback", timeout=1)
        assert node.name == node.name() == "w1" and node.worker_queue == "agents.continue,agents,agents.large"

        # pytest-celery's kill() (a signal by name) on a worker holding runs: it is gone, the runs finish
        ids = [submit_run("u-pc", f"buy a lamp {i}") for i in range(4)]
        deadline = time.monotonic() + 30
        while not any(node.owns(int((r.owner or "x:0").split(":")[1])) for r in map(runs.get_run, ids) if r):
            assert time.monotonic() < deadline, "w1 never held a run"
            time.sleep(0.05)
        node.kill()
        assert node.container.status == "exited" and not node.alive
        assert wait_terminal(ids, 60)
        assert {runs.get_run(r).state for r in ids} == {"done"}

        # and restart() brings it back through the adapter
        node.restart()
        assert node.alive and node.container.status == "running"
        assert setup.worker_cluster.ready()
        assert check_history(ids) == []
        with pytest.raises(NotImplementedError):
            setup.broker.kill()  # the shared Redis is never killed through its node
    finally:
        cluster.close()
