"""Real `celery -A tasks worker` processes for the tests, each in its own process group."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from chaos.harness import wait_for as poll
from checkpoints import runs
from checkpoints.db import transaction
from checkpoints.schema import run_checkpoints
from harness.history import check_history
from harness.workers import WorkerProcess


def wait_for(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """chaos.harness.wait_for, failing the test with `what` on timeout."""
    value = poll(pred, timeout, every)
    if not value:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")
    return value


def wait_terminal(run_ids: list[str], timeout: float = 60) -> list[runs.Run]:
    def all_done() -> list[runs.Run] | None:
        rows = [row for row in (runs.get_run(r) for r in run_ids) if row is not None and row.terminal]
        return rows if len(rows) == len(run_ids) else None

    return wait_for(all_done, timeout, f"{len(run_ids)} runs to end")


class Pool:
    """The workers of one test; stopped (SIGKILL to each group) when the test ends."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.workers: list[WorkerProcess] = []

    def start(self, name: str, pool: str = "threads", concurrency: int = 4, app: str = "tasks",
              **env: str) -> WorkerProcess:
        w = WorkerProcess(name, env={**os.environ, **env}, log_path=self.tmp / f"{name}.log",
                          concurrency=concurrency, pool=pool, app=app)
        w.start()
        self.workers.append(w)
        return w

    def by_pid(self, pid: int) -> WorkerProcess:
        try:
            group = os.getpgid(pid)  # a prefork child is in its worker's process group
        except ProcessLookupError:
            group = pid
        for w in self.workers:
            if w.alive and group == w.pid:
                return w
        raise LookupError(f"no live worker has pid {pid}")

    def holder_of(self, run_id: str) -> WorkerProcess | None:
        run = runs.get_run(run_id)
        if run is None or not run.owner:
            return None
        return self.by_pid(int(run.owner.split(":")[1]))

    def stop_all(self) -> None:
        for w in self.workers:
            w.stop()


@pytest.fixture
def workers(tmp_path: Path, mysql_store: str) -> Iterator[Pool]:
    """Real workers for one test; when it ends, they are stopped and the history checker reads every
    run the test made (the store starts empty): no stale write, stream out of order, unrecorded paid
    call, account drift or second order may have happened, whatever the test itself asserted."""
    pool = Pool(tmp_path)
    yield pool
    pool.stop_all()
    with transaction(readonly=True) as conn:
        run_ids = [r for (r,) in conn.execute(sa.select(run_checkpoints.c.run_id))]
    violations = check_history(run_ids)
    assert not violations, "history checker: " + "; ".join(str(v) for v in violations)


def wait_zombie_refused(run_id: str, zombie: WorkerProcess, what: str = "write") -> set[str]:
    """After a frozen holder (`zombie`) was woken: wait for its refused write in the ledger, check that
    the run's outcome is another holder's, and return the zombie's lease tokens."""
    from checkpoints import ledger

    tokens = {e.actor for e in ledger.history(run_id) if e.kind in ("claimed", "takeover")
              and e.actor.split(":")[1] == str(zombie.pid)}
    wait_for(lambda: any(e.kind == "fence_rejected" and e.actor in tokens for e in ledger.history(run_id)),
             15, f"the zombie's refused {what}")
    done = [e for e in ledger.history(run_id) if e.kind == "done"]
    assert len(done) == 1 and done[0].actor not in tokens, "the outcome is the new holder's"
    return tokens
