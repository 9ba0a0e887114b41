"""Routing benchmark: N workers, one slowed (its steps K x longer), R runs at a steady rate; shared vs reach.

`python -m bench.routing --runs 200` on the stores of FENCED_REDIS_URL / FENCED_DB_URL (it flushes that
Redis and empties the run tables: never point it at data you keep). Prints one JSON object per policy:
p50/p95 run latency (created to ended) and runs per worker (the worker that claimed the first step)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from chaos.report import percentile
from harness.workers import WorkerProcess

TEST_ENV = {"FENCED_LEASE_TTL_MS": "2000", "FENCED_HEARTBEAT_MS": "500", "FENCED_REAPER_TICK_MS": "250",
            "FENCED_SWEEPER_INTERVAL_MS": "1000", "FENCED_SWEEPER_GRACE_MS": "4000", "FENCED_STUB_STEP_MS": "200",
            "FENCED_ROUTING_HEARTBEAT_MS": "1000", "FENCED_ROUTING_SCAN_MS": "500",
            "FENCED_MAX_RUNS_PER_USER": "1000", "FENCED_MAX_QUEUED_RUNS": "100000"}


def _reset() -> None:
    from checkpoints.db import transaction
    from checkpoints.schema import metadata
    from fencing.connection import get_redis

    get_redis().flushall()
    with transaction() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())


def run_policy(policy: str, runs: int, rate: float, workers: int, slow_factor: int, log_dir: Path) -> dict[str, Any]:
    """One measured round under `policy`; returns its numbers."""
    os.environ.update(TEST_ENV)
    os.environ["FENCED_ROUTING"] = policy
    from checkpoints.db import dispose_all, migrate, transaction
    from checkpoints.schema import run_checkpoints, run_ledger
    from fenced_core.settings import get_settings
    from fencing.connection import reset

    get_settings.cache_clear()
    reset()
    dispose_all()
    migrate()
    _reset()
    step_ms = int(TEST_ENV["FENCED_STUB_STEP_MS"])
    procs = []
    for i in range(workers):
        slow = i == workers - 1
        env = {**os.environ, "FENCED_STUB_STEP_MS": str(step_ms * slow_factor if slow else step_ms)}
        name = f"slow{i}" if slow else f"w{i}"
        procs.append(WorkerProcess(name, env=env, log_path=log_dir / f"{policy}-{name}.log").start())
    try:
        from tasks import submit_run

        ids = []
        t0 = time.monotonic()
        for i in range(runs):
            ids.append(submit_run(f"u{i}", "buy headphones"))
            time.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with transaction(readonly=True) as conn:
                left = conn.execute(sa.select(sa.func.count()).select_from(run_checkpoints).where(
                    run_checkpoints.c.state.in_(("queued", "running")))).scalar_one()
            if not left:
                break
            time.sleep(0.5)
        with transaction(readonly=True) as conn:
            rows = conn.execute(sa.select(run_checkpoints.c.run_id, run_checkpoints.c.state,
                                          run_checkpoints.c.created_at_ms, run_checkpoints.c.updated_at_ms)).all()
            claims = conn.execute(sa.select(run_ledger.c.run_id, run_ledger.c.actor).where(
                run_ledger.c.kind.in_(("claimed", "takeover"))).order_by(run_ledger.c.id)).all()
    finally:
        for p in procs:
            p.stop()
    by_pid = {str(p.pid): p.name for p in procs}
    first: dict[str, str] = {}
    for run_id, actor in claims:
        first.setdefault(run_id, by_pid.get(actor.split(":")[1], "?") if ":" in actor else "?")
    latencies = [(r.updated_at_ms - r.created_at_ms) / 1000 for r in rows]
    return {"policy": policy, "runs": len(rows), "done": sum(r.state == "done" for r in rows),
            "p50_s": round(percentile(latencies, 50) or 0, 3), "p95_s": round(percentile(latencies, 95) or 0, 3),
            "runs_per_worker": dict(sorted(Counter(first.values()).items())), "rate_per_s": rate,
            "workers": workers, "slow_factor": slow_factor}


def main() -> None:
    """Parse the options, measure shared then reach, print the results."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rate", type=float, default=4.0, help="submissions per second")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--slow-factor", type=int, default=5)
    ap.add_argument("--policies", default="shared,reach")
    args = ap.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="fenced-routing-bench-"))
    for policy in args.policies.split(","):
        print(json.dumps(run_policy(policy, args.runs, args.rate, args.workers, args.slow_factor, log_dir)),
              flush=True)


if __name__ == "__main__":
    main()
