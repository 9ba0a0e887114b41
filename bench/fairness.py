"""Fairness under load: a flood of normal runs with a few large ones, promoter off and on; prints a table.

`python -m bench.fairness` starts real workers (harness.workers.WorkerProcess), submits the flood as fast
as it can, waits for every run, and measures from the database: submit -> first claim per kind (ledger
'submitted' and first 'claimed'), the wait of each continuation step (claim of step n+1 minus checkpoint
B of step n), and whether every large run started before the normal backlog drained (the last normal
run's first claim). Stores: FENCED_REDIS_URL / FENCED_DB_URL if set, else a private redis-server and a
fresh SQLite file, as the demo does. The table goes to stdout and to bench/results/fairness.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from bench.stats import pct

if TYPE_CHECKING:
    from checkpoints.runs import Run

RESULTS = Path(__file__).with_name("results") / "fairness.md"
OFF_MS = 86_400_000  # "off": the promoter's first tick would come after a day


@dataclass
class Mode:
    """One pass of the flood: promoter off (interval None) or on every `interval_ms`."""

    interval_ms: int | None

    @property
    def label(self) -> str:
        return "off" if self.interval_ms is None else f"every {self.interval_ms} ms"


@dataclass
class Measured:
    """What one pass measured, in ms."""

    mode: Mode
    first_claim: dict[str, list[int]] = field(default_factory=dict)  # kind -> submit -> first claim
    continuation: list[int] = field(default_factory=list)  # checkpoint B of step n -> claim of step n+1
    large_before_drain: int = 0
    large_total: int = 0
    drained_after_ms: int = 0  # first submit -> the last normal run's first claim
    promoted: int = 0
    done: int = 0
    verified: int = 0
    runs: int = 0
    wall_s: float = 0.0


def flood_order(n_normal: int, n_large: int) -> list[str]:
    """Kinds in submit order: large runs spread evenly through the normal flood."""
    order = ["normal"] * n_normal
    for i in range(n_large):
        order.insert(round((i + 0.5) * n_normal / n_large) + i, "large")
    return order


def run_pass(mode: Mode, args: argparse.Namespace, logs: Path, tag: str) -> Measured:
    """Start the workers, flood, wait for every run, measure, stop the workers."""
    from fencing.connection import get_redis
    from harness.workers import WorkerProcess
    from tasks import queues, submit_run

    client = get_redis()
    waiting = {q: client.llen(q) for q in queues.ALL}
    if any(waiting.values()):
        raise SystemExit(f"the queues are not empty ({waiting}): use a dedicated Redis for the benchmark")
    env = {"FENCED_STUB_STEP_MS": str(args.step_ms),
           "FENCED_LARGE_PROMOTE_EVERY_MS": str(mode.interval_ms or OFF_MS)}
    workers = [WorkerProcess(f"bench{i}", env=env, log_path=logs / f"{tag}-w{i}.log", concurrency=args.concurrency)
               for i in range(1, args.workers + 1)]
    started = time.monotonic()
    try:
        for w in workers:
            w.start(wait_ready=False)
        for w in workers:
            w.wait_for_log("ready.", timeout=60)
        kinds = flood_order(args.normal, args.large)
        # Many users, each far below max_runs_per_user; fresh names so earlier passes' charges don't matter.
        ids = {submit_run(f"bench-{tag}-{i % args.users}", "buy headphones", kind): kind
               for i, kind in enumerate(kinds)}
        finished = wait_terminal(list(ids), args.timeout_s)
    finally:
        for w in workers:
            w.stop()
    m = measure(mode, ids)
    m.done = sum(r.state == "done" for r in finished)
    m.wall_s = time.monotonic() - started
    return m


def wait_terminal(run_ids: list[str], timeout_s: float) -> list[Run]:
    """Every run once all are terminal; raises after `timeout_s`."""
    from checkpoints import runs

    deadline = time.monotonic() + timeout_s
    while True:
        rows = [runs.get_run(r) for r in run_ids]
        ended = [r for r in rows if r is not None and r.terminal]
        if len(ended) == len(run_ids):
            return ended
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(run_ids) - len(ended)} of {len(run_ids)} runs did not end in {timeout_s:g} s")
        time.sleep(0.2)


def measure(mode: Mode, ids: dict[str, str]) -> Measured:
    """Read the ledger, attempts and checkpoints of the pass's runs."""
    import sqlalchemy as sa

    from checkpoints import ledger
    from checkpoints.db import transaction
    from checkpoints.schema import run_attempts, run_steps
    from harness.verdict import check_run

    m = Measured(mode, runs=len(ids))
    submitted: dict[str, int] = {}
    first: dict[str, int] = {}
    for run_id in ids:
        history = ledger.history(run_id)
        submitted[run_id] = next(e.at_ms for e in history if e.kind == "submitted")
        first[run_id] = next(e.at_ms for e in history if e.kind in ("claimed", "takeover"))
        m.promoted += any(e.kind == "promoted" for e in history)
        m.verified += check_run(run_id).ok
    for kind in ("normal", "large"):
        m.first_claim[kind] = [first[r] - submitted[r] for r, k in ids.items() if k == kind]
    drained = max(first[r] for r, k in ids.items() if k == "normal")
    large = [r for r, k in ids.items() if k == "large"]
    m.large_total = len(large)
    m.large_before_drain = sum(first[r] < drained for r in large)
    m.drained_after_ms = drained - min(submitted.values())
    with transaction(readonly=True) as conn:
        claims = conn.execute(sa.select(run_attempts.c.run_id, run_attempts.c.step,
                                        sa.func.min(run_attempts.c.started_at_ms))
                              .where(run_attempts.c.run_id.in_(list(ids)))
                              .group_by(run_attempts.c.run_id, run_attempts.c.step)).all()
        handed = conn.execute(sa.select(run_steps.c.run_id, run_steps.c.step, sa.func.min(run_steps.c.at_ms))
                              .where(run_steps.c.run_id.in_(list(ids)), run_steps.c.phase == "done")
                              .group_by(run_steps.c.run_id, run_steps.c.step)).all()
    claim_at = {(r, s): at for r, s, at in claims}
    m.continuation = [claim_at[(r, s + 1)] - at for r, s, at in handed if (r, s + 1) in claim_at]
    return m


def table(results: list[Measured]) -> str:
    """The markdown table of every pass."""
    lines = ["| promoter | what | n | p50 ms | p95 ms | max ms | large started before the normal backlog drained |",
             "|---|---|---|---|---|---|---|"]
    for m in results:
        rows = [(f"{k} run: submit -> first claim", v) for k, v in m.first_claim.items()]
        rows.append(("continuation: checkpoint B -> next claim", m.continuation))
        for i, (what, values) in enumerate(rows):
            verdict = ""
            if i == 1:
                verdict = (f"{m.large_before_drain}/{m.large_total} (drained {m.drained_after_ms / 1000:.1f} s "
                           f"after the first submit; {m.promoted} promoted)")
            lines.append(f"| {m.mode.label} | {what} | {len(values)} | {pct(values, 50)} | {pct(values, 95)} | "
                         f"{max(values)} | {verdict} |")
    return "\n".join(lines)


def report(results: list[Measured], args: argparse.Namespace, stores: str) -> str:
    """The whole markdown report: date, parameters, table, and how every pass ended."""
    params = (f"{args.normal} normal + {args.large} large runs (large spread evenly through the flood), "
              f"{args.users} users, {args.workers} workers x concurrency {args.concurrency} (threads pool), "
              f"FENCED_STUB_STEP_MS={args.step_ms}; stores: {stores}; {os.cpu_count()} CPUs, "
              f"Python {platform.python_version()}")
    ends = "; ".join(f"promoter {m.mode.label}: {m.done}/{m.runs} done, {m.verified}/{m.runs} pass check_run, "
                     f"{m.wall_s:.1f} s" for m in results)
    return (f"# Fairness under load\n\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
            f"`{' '.join(['python -m bench.fairness', *sys.argv[1:]])}`\n\n{params}\n\n{table(results)}\n\n{ends}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__.splitlines()[0])
    p.add_argument("--normal", type=int, default=60)
    p.add_argument("--large", type=int, default=6)
    p.add_argument("--users", type=int, default=22, help="runs are spread over this many users")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--step-ms", type=int, default=100, help="FENCED_STUB_STEP_MS of the workers")
    p.add_argument("--promote-every-ms", default="2000,500",
                   help="comma-separated promoter intervals to measure after a pass with the promoter off")
    p.add_argument("--timeout-s", type=float, default=180)
    p.add_argument("--no-write", action="store_true", help="print only; do not write bench/results/fairness.md")
    args = p.parse_args(argv)
    modes = [Mode(None), *(Mode(int(ms)) for ms in args.promote_every_ms.split(",") if ms)]

    from harness.demo import quiet_core_logs
    from harness.embedded import Stores

    base = Path(tempfile.mkdtemp(prefix="fenced-bench-"))
    with Stores(base) as stores:
        from checkpoints.db import migrate

        migrate()
        quiet_core_logs()
        where = f"redis {stores.describe()['redis']}, db {stores.describe()['db']}"
        print(f"stores: {where}; worker logs in {base}", file=sys.stderr)
        stamp = datetime.now(UTC).strftime("%H%M%S")
        results = []
        for i, mode in enumerate(modes):
            print(f"pass {i + 1}/{len(modes)}: promoter {mode.label}", file=sys.stderr)
            results.append(run_pass(mode, args, base, f"{stamp}-{i}"))
    text = report(results, args, where.replace(str(base), "<tmp>"))
    print(text)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)
    return 0 if all(m.done == m.runs == m.verified for m in results) else 1


if __name__ == "__main__":
    sys.exit(main())
