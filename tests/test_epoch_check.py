"""The start-up check that the database's epochs never went back (tasks.epoch_check): real MariaDB, real
Redis, a real `celery worker` process and the real `fenced` command."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from checkpoints import runs
from checkpoints.db import transaction
from checkpoints.schema import run_checkpoints
from fencing.epoch import current, raise_epoch
from harness.workers import WorkerProcess
from tasks import submit_run
from tasks.epoch_check import find_behind
from tests.conftest import ROOT


def _set_db_epoch(run_id: str, epoch: int) -> None:
    """What a lossy failover leaves (or an operator's repair): the row's epoch, set by hand."""
    with transaction() as conn:
        conn.execute(run_checkpoints.update().where(run_checkpoints.c.run_id == run_id).values(epoch=epoch))


def _fenced(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fenced_cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)


def _lossy_failover() -> tuple[str, str]:
    """Two runs; the database 'lost' the claims of the first: its epoch 1, its mirror 4. The second is in step."""
    lost, fine = submit_run("u-epoch", "buy a lamp"), submit_run("u-epoch", "buy a desk")
    _set_db_epoch(lost, 4)
    _set_db_epoch(fine, 2)
    raise_epoch(lost, 4)
    raise_epoch(fine, 2)
    _set_db_epoch(lost, 1)  # the failover: the commits that took it from 1 to 4 are gone
    return lost, fine


def test_the_check_finds_exactly_the_runs_behind(mysql_store, redis_client):
    lost, _fine = _lossy_failover()
    behind, checked = find_behind(recheck_after_s=0)
    assert checked == 2
    assert [(b.run_id, b.db_epoch, b.mirror) for b in behind] == [(lost, 1, 4)]
    _set_db_epoch(lost, 5)  # repaired: above its mirror
    assert find_behind(recheck_after_s=0) == ([], 2)


def test_a_run_without_a_mirror_or_a_finished_run_is_not_checked(mysql_store, redis_client):
    wiped, finished = submit_run("u-epoch", "buy a lamp"), submit_run("u-epoch", "buy a desk")
    redis_client.flushall()  # Redis lost every mirror (a wipe): nothing to compare
    assert current(wiped) is None
    raise_epoch(finished, 4)
    with transaction() as conn:  # a finished run is out of the sample, whatever its epoch
        conn.execute(run_checkpoints.update().where(run_checkpoints.c.run_id == finished).values(state="done"))
    assert find_behind(recheck_after_s=0) == ([], 1)


def test_a_mirror_raised_just_before_a_commit_is_not_reported(mysql_store, redis_client):
    """A cancel raises the mirror inside its transaction, before the commit: the suspect is read again."""
    run_id = submit_run("u-epoch", "buy a lamp")
    raise_epoch(run_id, 1)
    committer = threading.Timer(0.3, _set_db_epoch, (run_id, 1))
    committer.start()
    try:
        assert find_behind(recheck_after_s=1.0) == ([], 1)
    finally:
        committer.join()


def test_a_worker_refuses_to_start_and_starts_once_repaired(mysql_store, redis_client, tmp_path: Path):
    lost, fine = _lossy_failover()
    worker = WorkerProcess("epochs", log_path=tmp_path / "w.log", concurrency=1)
    worker.start(wait_ready=False)
    assert worker.proc is not None
    try:
        assert worker.proc.wait(60) != 0
    finally:
        worker.stop()  # a worker that did start (the check broken) must not outlive the test
    logs = worker.logs()
    assert "fenced worker refuses to start" in logs
    assert f"{lost} (database epoch 1, Redis mirror 4)" in logs
    assert fine not in logs
    assert "ready." not in logs  # it consumed nothing
    assert runs.get_run(lost).state == "queued"

    # The operator's override starts it anyway (and says nothing was checked).
    worker.env["FENCED_EPOCH_CHECK_RUNS"] = "0"
    try:
        worker.start(wait_ready=True)
    finally:
        worker.stop()

    # The documented repair: the row's epoch above its mirror; the worker then starts and the run finishes.
    _set_db_epoch(lost, 5)
    worker.env.pop("FENCED_EPOCH_CHECK_RUNS")
    worker.start(wait_ready=True)
    try:
        assert "epoch_check_passed" in worker.logs()
        deadline = time.monotonic() + 45  # its wake-up was used up by the override's worker: the sweeper's
        while runs.get_run(lost).state != "done" and time.monotonic() < deadline:
            time.sleep(0.2)
        done = runs.get_run(lost)
        assert done.state == "done" and done.epoch > 5
    finally:
        worker.stop()


def test_the_cli_reports_it_and_refuses_to_write(mysql_store, redis_client):
    lost, _fine = _lossy_failover()
    check = _fenced("check-epochs")
    assert check.returncode == 1
    assert f"{lost} (database epoch 1, Redis mirror 4)" in check.stderr
    assert "After a database failover" in check.stderr

    cancel = _fenced("cancel", lost)
    assert cancel.returncode == 1
    assert "refusing to write" in cancel.stderr
    assert runs.get_run(lost).state == "queued"  # nothing written
    submitted = _fenced("submit", "--user", "u-epoch", "buy a chair")
    assert submitted.returncode == 1
    assert len(runs.list_runs(limit=10)) == 2

    _set_db_epoch(lost, 5)
    check = _fenced("check-epochs", "--json")
    assert check.returncode == 0, check.stderr
    assert '"checked": 2' in check.stdout
    assert _fenced("cancel", lost).returncode == 0
    assert runs.get_run(lost).state == "cancelled"


def test_repair_epochs_fences_every_holder_from_before_the_failover(mysql_store, redis_client):
    from checkpoints.db import in_txn
    from checkpoints.ledger import history
    from checkpoints.runs import fenced_update_txn
    from fenced_core.errors import FencedOut

    lost, fine = _lossy_failover()
    _set_db_epoch(lost, 1)
    with transaction() as conn:  # the lost run was running, held at epoch 4 by a worker before the failover
        conn.execute(run_checkpoints.update().where(run_checkpoints.c.run_id == lost).values(state="running"))

    dry = _fenced("repair-epochs")
    assert dry.returncode == 1 and f"{lost}: database epoch 1, Redis mirror 4 -> would become 5" in dry.stdout
    assert runs.get_run(lost).epoch == 1  # without --yes nothing is written

    done = _fenced("repair-epochs", "--yes", "--user", "ops")
    assert done.returncode == 0, done.stderr
    assert f"{lost}: epoch 1 -> 5 (Redis mirror was 4)" in done.stdout and fine not in done.stdout
    row = runs.get_run(lost)
    assert (row.epoch, row.owner, row.state) == (5, None, "running")
    assert current(lost) == 5 and runs.get_run(fine).epoch == 2
    repaired = [e for e in history(lost) if e.kind == "epoch_repaired"]
    assert [(e.epoch, e.actor) for e in repaired] == [(5, "ops")]
    assert _fenced("check-epochs").returncode == 0

    # the holder from before the failover (epoch 4) and the one whose claim the database kept (epoch 1)
    # can no longer write: neither owns the epoch
    for stale in (4, 1):
        try:
            in_txn(fenced_update_txn, lost, stale, "a stale holder's checkpoint", phase="decided")
        except FencedOut:
            continue
        raise AssertionError(f"a holder at epoch {stale} wrote after the repair")
