"""Throughput (a burst of runs) and latency (one run at a time) of each contender, on real workers.

Contenders: plain Celery (`bench.plain_app`), fenced on MariaDB, fenced on SQLite, DBOS on PostgreSQL
(`bench.dbos_app`). Each gets the same number of worker processes x concurrency, the same private
Redis (broker for the Celery ones) and the same work per step (`bench.work`).

Throughput: submit `runs` runs as fast as one client can, from the first submit to the last finish
recorded by the contender itself (plain: a Redis hash; fenced: `finished_at_ms`; DBOS: the workflow's
`updated_at`). Latency: `latency_runs` runs one after another, submit to done as the client sees it
(plain: BLPOP; fenced: the `run:done` event; DBOS: its status row, polled every 2 ms).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.work import QUERY, STEPS_PER_RUN

WARMUP = 5


@dataclass
class Result:
    """One contender's figures."""

    name: str
    runs: int = 0
    done: int = 0
    wall_s: float = 0.0
    submit_s: float = 0.0
    latency_ms: list[float] = field(default_factory=list)  # whole run, submit -> done seen by the client
    notes: list[str] = field(default_factory=list)
    failed_checks: list[str] = field(default_factory=list)  # runs that broke a promise (harness.verdict)

    @property
    def runs_per_s(self) -> float:
        return self.done / self.wall_s if self.wall_s else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.runs_per_s * STEPS_PER_RUN

    def to_dict(self) -> dict[str, Any]:
        from bench.stats import summary

        return {"name": self.name, "runs": self.runs, "done": self.done, "wall_s": round(self.wall_s, 3),
                "submit_s": round(self.submit_s, 3), "runs_per_s": round(self.runs_per_s, 1),
                "steps_per_s": round(self.steps_per_s, 1),
                "latency_ms": summary(self.latency_ms), "step_latency_ms": summary(
                    [v / STEPS_PER_RUN for v in self.latency_ms]), "notes": self.notes,
                "failed_checks": self.failed_checks}


def combine(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """One contender's interleaved passes (`Result.to_dict()` each, in round order) as one figure: the pass
    with the median runs/s stands for it (its latency too), every pass is kept under `passes`, and what went
    wrong in any round shows in the figure: every pass's failed checks, and a note for each round that did
    not finish its runs."""
    if len(passes) == 1:
        return passes[0]
    middle = sorted(passes, key=lambda x: x["runs_per_s"])[(len(passes) - 1) // 2]
    short = [f"round {k}: {x['done']} of {x['runs']} runs done"
             for k, x in enumerate(passes, 1) if x["done"] != x["runs"]]
    return {**middle, "passes": passes, "failed_checks": [c for x in passes for c in x["failed_checks"]],
            "notes": [*middle["notes"], *short]}


@dataclass
class Params:
    runs: int = 400
    latency_runs: int = 100
    workers: int = 2
    concurrency: int = 4
    timeout_s: float = 300.0
    log_dir: Path = Path(".")
    step_ms: int = 0  # the stub model's latency per step in the workers
    # fenced submits its burst through submit_many in batches this big (1: one submit_run per run)
    submit_batch: int = 50

    @property
    def worker_env(self) -> dict[str, str]:
        return {"FENCED_STUB_STEP_MS": str(self.step_ms), "FENCED_STUB_TOOL_MS": "0"}


def wait_until(done: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.02) -> None:
    """chaos.harness.wait_for, raising TimeoutError naming `what` if it never happens."""
    from chaos.harness import wait_for

    if not wait_for(done, timeout_s, every_s):
        raise TimeoutError(f"{what} did not happen within {timeout_s:g} s")


@contextmanager
def celery_workers(p: Params, tag: str, app: str) -> Iterator[None]:
    from harness.workers import WorkerProcess

    workers = [WorkerProcess(f"{tag}{i}", env=p.worker_env, log_path=p.log_dir / f"{tag}{i}.log",
                             concurrency=p.concurrency, app=app) for i in range(1, p.workers + 1)]
    try:
        for w in workers:
            w.start(wait_ready=False)
        for w in workers:
            w.wait_for_log("ready.", timeout=60)
        yield
    finally:
        for w in workers:
            w.stop()


# -- plain Celery ------------------------------------------------------------------------------------
def plain(p: Params) -> Result:
    from bench.plain_app import DONE, done_key, submit
    from fencing.connection import get_redis

    r = Result("plain Celery", runs=p.runs)
    client = get_redis()
    with celery_workers(p, "plain", "bench.plain_app"):
        for _ in range(WARMUP):
            rid = f"warm-{uuid.uuid4().hex}"
            submit(rid)
            client.blpop([done_key(rid)], timeout=30)
        client.delete(DONE)
        ids = [f"plain-{i}-{uuid.uuid4().hex[:8]}" for i in range(p.runs)]
        started = time.time()
        for rid in ids:
            submit(rid)
        r.submit_s = time.time() - started
        wait_until(lambda: client.hlen(DONE) >= p.runs, p.timeout_s, f"{p.runs} plain runs")
        finished: list[str] = client.hvals(DONE)  # type: ignore[assignment]
        r.done = len(finished)
        r.wall_s = max(int(v) for v in finished) / 1000 - started
        for _ in range(p.latency_runs):
            rid = f"lat-{uuid.uuid4().hex}"
            t = time.perf_counter()
            submit(rid)
            if client.blpop([done_key(rid)], timeout=30) is None:
                raise TimeoutError(f"plain run {rid} did not finish in 30 s")
            r.latency_ms.append((time.perf_counter() - t) * 1000)
    return r


# -- fenced ---------------------------------------------------------------------------------------------
def fenced(p: Params, store: str, redis_url: str, db_url: str, name: str = "") -> Result:
    """The burst goes in through `submit_many` (batches of `p.submit_batch`), the client API for a burst;
    with `submit_batch` 1, one `submit_run` per run. Latency runs are one `submit_run` each either way."""
    from bench.stores import using

    r = Result(name or f"fenced on {store}", runs=p.runs)
    with using(redis_url, db_url), celery_workers(p, f"fenced-{store}-", "tasks"):
        from tasks import submit_run

        for _ in range(WARMUP):
            _wait_done_event(submit_run(f"warm-{uuid.uuid4().hex[:12]}", QUERY))
        started = time.time()
        ids = burst(p.runs, p.submit_batch)
        r.submit_s = time.time() - started
        if p.submit_batch > 1:
            r.notes.append(f"burst submitted through submit_many in batches of {p.submit_batch}")
        wait_until(lambda: _terminal(ids)[0] >= p.runs, p.timeout_s, f"{p.runs} fenced runs on {store}", 0.05)
        r.done, last_ms = _terminal(ids, state="done")
        r.wall_s = last_ms / 1000 - started
        for _ in range(p.latency_runs):
            t = time.perf_counter()
            _wait_done_event(submit_run(f"lat-{uuid.uuid4().hex[:12]}", QUERY))
            r.latency_ms.append((time.perf_counter() - t) * 1000)
        r.failed_checks = _verdicts(ids)
    return r


def burst(runs: int, batch: int) -> list[str]:
    """Submit `runs` runs, each for a new user: through submit_many in batches of `batch` (1: submit_run)."""
    from tasks import submit_run
    from tasks.submit import SubmitRequest, submit_many

    users = [f"bench-{i}-{uuid.uuid4().hex[:8]}" for i in range(runs)]
    if batch <= 1:
        return [submit_run(u, QUERY) for u in users]
    ids: list[str] = []
    for at in range(0, runs, batch):
        for o in submit_many([SubmitRequest(u, QUERY) for u in users[at:at + batch]]):
            if o.run_id is None:
                raise RuntimeError(f"a bench submit was refused: {o.refused!r}")
            ids.append(o.run_id)
    return ids


def _terminal(ids: list[str], state: str | None = None) -> tuple[int, int]:
    """(how many of `ids` ended [in `state`], the latest finished_at_ms)."""
    import sqlalchemy as sa

    from checkpoints.db import transaction
    from checkpoints.schema import TERMINAL_STATES
    from checkpoints.schema import run_checkpoints as rc

    states = [state] if state else list(TERMINAL_STATES)
    with transaction(readonly=True) as conn:
        n, last = conn.execute(sa.select(sa.func.count(), sa.func.max(rc.c.finished_at_ms))
                               .where(rc.c.run_id.in_(ids), rc.c.state.in_(states))).one()
    return int(n), int(last or 0)


def _wait_done_event(run_id: str, timeout_s: float = 30) -> None:
    """Block on the run's event stream until its `run:done` event (what a live client waits for)."""
    from fencing import keys
    from fencing.connection import get_redis

    client = get_redis()
    last = "0"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply: Any = client.xread({keys.events(run_id): last}, block=1000)
        for _stream, entries in reply or []:
            for stream_id, fields in entries:
                last = stream_id
                if fields.get("eid") == "run:done":
                    return
                if fields.get("eid") in ("run:failed", "run:dead"):
                    raise RuntimeError(f"run {run_id} ended {fields.get('eid')}")
    raise TimeoutError(f"run {run_id} did not finish in {timeout_s:g} s")


def _verdicts(ids: list[str]) -> list[str]:
    from harness.verdict import check_run

    return [rid for rid in ids if not check_run(rid).ok]


# -- DBOS -----------------------------------------------------------------------------------------------
@contextmanager
def dbos_workers(p: Params, db_url: str) -> Iterator[None]:
    procs = []
    try:
        for i in range(1, p.workers + 1):
            log = open(p.log_dir / f"dbos{i}.log", "ab")
            procs.append((subprocess.Popen(
                [sys.executable, "-m", "bench.dbos_app", "--db-url", db_url, "--concurrency", str(p.concurrency),
                 "--executor-id", f"bench-{i}"], stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **p.worker_env, "PYTHONUNBUFFERED": "1"}, start_new_session=True), log))
            # One at a time: each process migrates the system database on launch.
            log_path = p.log_dir / f"dbos{i}.log"

            def ready(path: Path = log_path) -> bool:
                return "ready." in path.read_text(errors="replace") or procs[-1][0].poll() is not None

            wait_until(ready, 60, f"dbos worker {i}")
            if procs[-1][0].poll() is not None:
                raise RuntimeError(f"dbos worker {i} exited: {(p.log_dir / f'dbos{i}.log').read_text()[-2000:]}")
        yield
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
            log.close()


def dbos(p: Params, db_url: str) -> Result:
    import sqlalchemy as sa
    from dbos import DBOSClient

    from bench.dbos_app import QUEUE, WORKFLOW

    r = Result("DBOS on PostgreSQL", runs=p.runs)
    with dbos_workers(p, db_url):
        client = DBOSClient(system_database_url=db_url)
        engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
        options: Any = {"queue_name": QUEUE, "workflow_name": WORKFLOW}

        def status(ids: list[str]) -> tuple[int, int]:
            with engine.connect() as conn:
                n, last = conn.execute(sa.text(
                    "SELECT count(*), max(updated_at) FROM dbos.workflow_status "
                    "WHERE status = 'SUCCESS' AND workflow_uuid = ANY(:ids)"), {"ids": ids}).one()
            return int(n), int(last or 0)

        def one(rid: str) -> None:
            client.enqueue({**options, "workflow_id": rid}, rid)  # type: ignore[typeddict-item]
            wait_until(lambda: status([rid])[0] == 1, 30, f"dbos workflow {rid}", every_s=0.002)

        try:
            for _ in range(WARMUP):
                one(f"warm-{uuid.uuid4().hex}")
            ids = [f"dbos-{i}-{uuid.uuid4().hex[:8]}" for i in range(p.runs)]
            started = time.time()
            for rid in ids:
                client.enqueue({**options, "workflow_id": rid}, rid)  # type: ignore[typeddict-item]
            r.submit_s = time.time() - started
            wait_until(lambda: status(ids)[0] >= p.runs, p.timeout_s, f"{p.runs} DBOS workflows", 0.05)
            r.done, last_ms = status(ids)
            r.wall_s = last_ms / 1000 - started
            for _ in range(p.latency_runs):
                t = time.perf_counter()
                one(f"lat-{uuid.uuid4().hex}")
                r.latency_ms.append((time.perf_counter() - t) * 1000)
        finally:
            client.destroy()
            engine.dispose()
    r.notes.append("queue polled every 10 ms (DBOS default 1 s); latency includes the client's 2 ms poll")
    return r
