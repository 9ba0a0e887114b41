"""Where a burst's CPU goes, by process: the workers, MariaDB's server, Redis, and the submitting client,
per step of zero-latency 4-step runs on real workers (issue 17; the inline-steps A/B).

    python -m bench.cpu_split --redis-url redis://127.0.0.1:PORT/0 --db-url mysql+pymysql://root@127.0.0.1:3306/DB \\
        --runs 400 --inline 8 --inline 0

Both stores must be private to this command (the Redis database is flushed, the database migrated),
and on this machine: the server processes' CPU is read from /proc (`mariadbd`, and the redis-server
listening on the Redis URL's port). Each `--inline N` is one pass with FENCED_INLINE_STEPS=N in the
workers (2 processes x `--concurrency` slots of `--pool`, threads by default); the burst goes in through
submit_many in batches of 50.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

# bench.inflight and bench.throughput import the Celery app, which reads the settings (broker and database
# URLs) once: they are imported after main() has set FENCED_* from the arguments.


def _server_pids(redis_url: str) -> dict[str, list[int]]:
    port = urlparse(redis_url).port or 6379
    mariadb = [int(p) for p in subprocess.check_output(["pgrep", "-x", "mariadbd"], text=True).split()]
    redis = [int(p) for p in subprocess.check_output(["pgrep", "-f", f"redis-server .*:{port}"], text=True).split()]
    if not mariadb or not redis:
        raise SystemExit(f"cpu_split needs mariadbd and a redis-server on port {port} on this machine")
    return {"mariadb": mariadb, "redis": redis}


def one_pass(runs: int, inline: int, concurrency: int, log_dir: Path, pool: str = "threads") -> dict[str, Any]:
    """One burst on fresh workers; CPU ms per step of each process group, and runs/s."""
    import sqlalchemy as sa

    from bench.inflight import cpu_s
    from bench.throughput import burst
    from bench.work import STEPS_PER_RUN
    from checkpoints.db import transaction
    from checkpoints.schema import run_checkpoints as rc
    from fencing.connection import get_redis
    from harness.workers import WorkerProcess

    get_redis().flushdb()
    env = {"FENCED_INLINE_STEPS": str(inline)}
    workers = [WorkerProcess(f"cpu-split-{inline}-{i}", env=env, log_path=log_dir / f"cpu-split-{inline}-{i}.log",
                             concurrency=concurrency, pool=pool) for i in (1, 2)]
    for w in workers:
        w.start(wait_ready=False)
    try:
        for w in workers:
            w.wait_for_log("ready.", timeout=60)

        def done(ids: list[str]) -> int:
            with transaction(readonly=True) as conn:
                return int(conn.execute(sa.select(sa.func.count()).where(rc.c.run_id.in_(ids), rc.c.state == "done"))
                           .scalar() or 0)

        warm = burst(10, 50)
        while done(warm) < len(warm):
            time.sleep(0.05)
        servers = _server_pids(os.environ["FENCED_REDIS_URL"])
        pids = {"workers": [w.proc.pid for w in workers if w.proc is not None], **servers}
        before = {k: sum(cpu_s(p) for p in v) for k, v in pids.items()}
        client, started = time.process_time(), time.monotonic()
        ids = burst(runs, 50)
        while done(ids) < runs:
            time.sleep(0.05)
        wall = time.monotonic() - started
        client_s = time.process_time() - client
        steps = runs * STEPS_PER_RUN
        per_step = {k: round((sum(cpu_s(p) for p in v) - before[k]) * 1000 / steps, 2) for k, v in pids.items()}
        return {"inline_steps": inline, "pool": pool, "concurrency": concurrency, "runs": runs,
                "runs_per_s": round(runs / wall, 1),
                "steps_per_s": round(steps / wall, 1),
                "cpu_ms_per_step": {**per_step, "client": round(client_s * 1000 / steps, 2)},
                "inline_deliveries": sum(w.logs().count("inline=True") for w in workers)}
    finally:
        for w in workers:
            w.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_split", description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", required=True, help="a private Redis database on this machine (flushed)")
    parser.add_argument("--db-url", required=True, help="a private MariaDB database on this machine (migrated)")
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--pool", default="threads", help="the workers' pool (threads, gevent)")
    parser.add_argument("--inline", type=int, action="append", help="FENCED_INLINE_STEPS of one pass (repeatable)")
    parser.add_argument("--log-dir", type=Path, help="where the workers' logs go (default: a new temporary directory)")
    args = parser.parse_args(argv)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="fenced-cpu-split-"))
    os.environ.update(FENCED_REDIS_URL=args.redis_url, FENCED_BROKER_URL=args.redis_url, FENCED_DB_URL=args.db_url,
                      FENCED_STUB_STEP_MS="0", FENCED_STUB_TOOL_MS="0", FENCED_MAX_QUEUED_RUNS="10000000",
                      FENCED_MAX_RUNS_PER_USER="10000000")
    from checkpoints.db import migrate

    migrate()
    for inline in args.inline or [8, 0]:
        print(json.dumps(one_pass(args.runs, inline, args.concurrency, log_dir, args.pool)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
