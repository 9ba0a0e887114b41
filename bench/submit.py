"""Submission rate from one client: submit_run, submit_many (batches) and plain Celery's apply_async, same Redis.

`python -m bench.submit [--runs 1000] [--batches 50,100] [--db-url URL] [--redis-url URL]`. Without
--redis-url a private redis-server is started on a free port (and stopped after); the MariaDB database
of --db-url (default `fenced_bench_submit` on 127.0.0.1:3306) is DROPPED and created afresh. No workers run: every
wake-up waits in its queue, which each phase counts (with the run rows) to prove it measured what it
says; the queues are emptied between phases. Limits and balances are raised so nothing is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

TARGET_PER_S = 500.0
USERS = 10
DEFAULT_DB = "mysql+pymysql://root@127.0.0.1:3306/fenced_bench_submit"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prepare_env(redis_url: str, db_url: str) -> None:
    os.environ.update({
        "FENCED_REDIS_URL": redis_url, "FENCED_DB_URL": db_url, "FENCED_LOG_LEVEL": "warning",
        "FENCED_MAX_QUEUED_RUNS": "10000000", "FENCED_MAX_RUNS_PER_USER": "10000000",
        "FENCED_DEFAULT_BALANCE_CREDITS": "1000000000000",
    })


def _fresh_db(db_url: str) -> None:
    import sqlalchemy as sa

    from checkpoints.db import migrate

    server, name = db_url.rsplit("/", 1)
    engine = sa.create_engine(server + "/")
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        conn.exec_driver_sql(f"CREATE DATABASE `{name}`")
    engine.dispose()
    migrate(db_url)


def _measure(name: str, n: int, fn: Callable[[int], None]) -> dict[str, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn(n)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"name": name, "submits": n, "wall_s": round(wall, 3), "per_s": round(n / wall, 1),
            "client_cpu_ms_per_submit": round(cpu / n * 1000, 3)}


def run(runs: int, batches: list[int]) -> dict[str, Any]:
    """Every phase once (after a warm-up of each); returns the figures."""
    import sqlalchemy as sa

    from bench import plain_app
    from checkpoints.db import transaction
    from checkpoints.schema import metadata, run_checkpoints
    from fencing.connection import get_redis
    from tasks import queues
    from tasks.submit import SubmitRequest, submit_many, submit_run

    client = get_redis()

    def reset() -> None:
        client.flushdb()
        with transaction() as conn:
            for table in reversed(metadata.sorted_tables):
                conn.execute(table.delete())

    def waiting() -> int:
        return int(client.llen(queues.NORMAL))

    def rows() -> int:
        with transaction(readonly=True) as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(run_checkpoints)).scalar() or 0)

    def by_run(n: int) -> None:
        for i in range(n):
            submit_run(f"bench-{i % USERS}", "buy headphones")

    def by_batch(size: int) -> Callable[[int], None]:
        def go(n: int) -> None:
            for start in range(0, n, size):
                out = submit_many([SubmitRequest(f"bench-{i % USERS}", "buy headphones")
                                   for i in range(start, min(start + size, n))])
                refused = [o.refused for o in out if o.refused is not None]
                if refused:
                    raise RuntimeError(f"the benchmark's batch was refused: {refused[0]}")
        return go

    def plain(n: int) -> None:
        for _ in range(n):
            plain_app.submit(str(uuid.uuid4()))

    phases: list[tuple[str, Callable[[int], None], bool]] = [("submit_run", by_run, True)]
    phases += [(f"submit_many (batches of {b})", by_batch(b), True) for b in batches]
    phases.append(("plain Celery apply_async", plain, False))
    results = []
    for name, fn, fenced in phases:
        reset()
        fn(min(50, runs))  # warm-up: connections, script loads, statement caches
        reset()
        got = _measure(name, runs, fn)
        # Measured what it says: one message waiting per submit (and one run row for fenced).
        got["messages_waiting"] = waiting()
        got["run_rows"] = rows() if fenced else None
        if got["messages_waiting"] != runs or (fenced and got["run_rows"] != runs):
            raise RuntimeError(f"{name}: {runs} submits left {got['messages_waiting']} messages and "
                               f"{got['run_rows']} rows")
        results.append(got)
    reset()
    best = max(r["per_s"] for r in results if r["run_rows"] is not None)
    return {"at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "runs": runs, "users": USERS,
            "target_per_s": TARGET_PER_S, "best_fenced_per_s": best, "met": best >= TARGET_PER_S,
            "phases": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.submit", description=__doc__)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--batches", default="50,100")
    p.add_argument("--db-url", default=None)
    p.add_argument("--redis-url", default=None)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = p.parse_args(argv)
    server = None
    redis_url = a.redis_url
    if redis_url is None:
        port = _free_port()
        server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                                  stdout=subprocess.DEVNULL)
        redis_url = f"redis://127.0.0.1:{port}/0"
        time.sleep(0.3)
    db_url = a.db_url or DEFAULT_DB
    _prepare_env(redis_url, db_url)
    try:
        _fresh_db(db_url)
        figures = run(a.runs, [int(b) for b in a.batches.split(",") if b])
    finally:
        if server is not None:
            server.terminate()
            server.wait(5)
    for r in figures["phases"]:
        print(f"{r['name']:<32} {r['per_s']:>8.1f} submits/s  {r['client_cpu_ms_per_submit']:>6.3f} ms CPU/submit  "
              f"({r['submits']} in {r['wall_s']} s)")
    print(f"target >= {TARGET_PER_S:g} submits/s from one client: best fenced {figures['best_fenced_per_s']:.1f}/s, "
          f"{'met' if figures['met'] else 'not met'}")
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
