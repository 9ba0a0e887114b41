"""Flower for real: `fenced flower` (`celery -A tasks flower`) lists our worker and its fenced.run_agent tasks,
whose arguments carry the run id an operator looks up with `fenced explain` / `fenced status`."""

from __future__ import annotations

import ast
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tasks import submit_run
from tests.workers_fixture import wait_for, wait_terminal

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def flower(tmp_path: Path) -> Iterator[str]:
    """`fenced flower` on a free port: it execs `celery -A tasks flower` bound to localhost, with the HTTP API
    open to local callers (FLOWER_UNAUTHENTICATED_API, which the command sets itself)."""
    port = _free_port()
    log = open(tmp_path / "flower.log", "wb")
    env = {k: v for k, v in os.environ.items() if k != "FLOWER_UNAUTHENTICATED_API"}
    proc = subprocess.Popen([sys.executable, "-m", "fenced_cli", "flower", f"--port={port}"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/api/workers", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 30, f"Flower to answer (log: {tmp_path / 'flower.log'})", every=0.3)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()


def test_flower_lists_our_worker_and_run_agent_tasks_with_the_run_id(workers, flower: str) -> None:
    # One step inline after each delivery's own: the run's four steps take two deliveries, so Flower
    # shows a task that ran two steps and a continuation.
    w = workers.start("fl", FENCED_INLINE_STEPS="1")
    run_id = submit_run("u1", "headphones")
    wait_terminal([run_id], timeout=40)

    def ours() -> list[str]:
        listed = httpx.get(f"{flower}/api/workers", params={"refresh": "1"}, timeout=10).json()
        return [name for name in listed if name.startswith(f"{w.name}@")]

    [node] = wait_for(ours, 20, "Flower to list worker fl")

    def run_tasks() -> list[dict[str, object]]:
        tasks = httpx.get(f"{flower}/api/tasks", params={"taskname": "fenced.run_agent"}, timeout=10).json()
        found = [t for t in tasks.values() if run_id in str(t.get("args"))]
        # The run's four steps: its first wake-up (task id = run id, steps 0 and 1) and one continuation
        # (steps 2 and 3), both succeeded.
        return found if len(found) == 2 and all(t.get("state") == "SUCCESS" for t in found) else []

    found = wait_for(run_tasks, 20, "Flower to show the run's two deliveries")
    assert {t["name"] for t in found} == {"fenced.run_agent"}
    assert {t["worker"] for t in found} == {node}
    assert run_id in {t["uuid"] for t in found}, "the first wake-up's task id is the run id"
    # run_agent(run_id, step): each wake-up carries the step it wakes (the first wake-up step 0).
    calls = sorted((tuple(ast.literal_eval(str(t["args"]))) for t in found), key=lambda a: a[1])
    assert calls == [(run_id, 0), (run_id, 2)], found
