"""Route switch time under `reach`: N workers, a steady submission rate, one killed (-9) and one frozen (SIGSTOP).

`python -m bench.routing_switch --workers 20` on the stores of FENCED_REDIS_URL / FENCED_DB_URL (flushed
and emptied: never point it at data you keep). Default registry intervals (heartbeat 5 s, scan 1 s).
Prints JSON: when each victim stopped receiving runs (its last routing decision, from the ledger) and
was marked offline, relative to the kill/freeze; false offline marks (a worker marked offline that was
neither killed nor frozen); runs lost (not done)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.routing import _reset
from harness.workers import WorkerProcess

ENV = {"FENCED_LEASE_TTL_MS": "6000", "FENCED_HEARTBEAT_MS": "1500", "FENCED_STUB_STEP_MS": "200",
       "FENCED_SWEEPER_INTERVAL_MS": "1000", "FENCED_SWEEPER_GRACE_MS": "12000", "FENCED_ROUTING": "reach",
       "FENCED_MAX_RUNS_PER_USER": "1000", "FENCED_MAX_QUEUED_RUNS": "100000", "FENCED_CONCURRENCY": "2"}


def measure(workers: int, rate: float, seconds: float, log_dir: Path) -> dict[str, Any]:
    """Start the workers, submit at `rate` for `seconds`, kill one at 1/3 and freeze one at 1/2."""
    os.environ.update(ENV)
    from checkpoints.db import dispose_all, migrate, transaction
    from checkpoints.schema import run_checkpoints, run_ledger
    from fenced_core.settings import get_settings
    from fencing import registry
    from fencing.connection import reset

    get_settings.cache_clear()
    reset()
    dispose_all()
    migrate()
    _reset()
    procs = [WorkerProcess(f"w{i}", env=dict(os.environ), log_path=log_dir / f"w{i}.log", concurrency=2)
             for i in range(workers)]
    for p in procs:
        p.start(timeout=120)
    time.sleep(2 * get_settings().routing_heartbeat_ms / 1000)
    killed, frozen = procs[0], procs[1]
    kill_ms = freeze_ms = 0
    from tasks import submit_run

    ids = []
    try:
        t0 = time.monotonic()
        n = int(rate * seconds)
        for i in range(n):
            ids.append(submit_run(f"u{i}", "buy headphones"))
            if not kill_ms and i >= n // 3:
                killed.kill(signal.SIGKILL)
                kill_ms = registry.now_ms()
            if not freeze_ms and i >= n // 2:
                frozen.kill(signal.SIGSTOP)
                freeze_ms = registry.now_ms()
            time.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
        time.sleep(20)
        names = {w.name: w for w in registry.all_workers()}
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with transaction(readonly=True) as conn:
                left = conn.execute(sa.select(sa.func.count()).select_from(run_checkpoints).where(
                    run_checkpoints.c.state.in_(("queued", "running")))).scalar_one()
            if not left:
                break
            time.sleep(1)
        with transaction(readonly=True) as conn:
            states = [s for (s,) in conn.execute(sa.select(run_checkpoints.c.state))]
            routed = [(at, json.loads(d)) for at, d in conn.execute(
                sa.select(run_ledger.c.at_ms, run_ledger.c.detail).where(run_ledger.c.kind == "routed"))]
    finally:
        frozen.kill(signal.SIGCONT)
        for p in procs:
            p.stop()

    def node(p: WorkerProcess) -> str:
        return next(n for n in names if n.startswith(f"{p.name}@"))

    def last_routed(p: WorkerProcess) -> int | None:
        ats = [at for at, d in routed if d.get("worker") == node(p)]
        return max(ats) if ats else None

    def offline(p: WorkerProcess) -> tuple[int | None, str]:
        w = names[node(p)]
        return (int(w.fields["offline_ms"]) if w.fields.get("offline_ms") else None), w.fields.get("offline_reason", "")

    k_off, k_why = offline(killed)
    f_off, f_why = offline(frozen)
    k_last, f_last = last_routed(killed), last_routed(frozen)
    false_offline = [n for n, w in names.items() if w.status == "offline" and n not in (node(killed), node(frozen))]
    return {"workers": workers, "rate_per_s": rate, "runs": len(states), "not_done": sum(s != "done" for s in states),
            "kill": {"offline_after_ms": k_off - kill_ms if k_off else None, "why": k_why,
                     "last_routed_after_ms": k_last - kill_ms if k_last else None},
            "freeze": {"offline_after_ms": f_off - freeze_ms if f_off else None, "why": f_why,
                       "last_routed_after_ms": f_last - freeze_ms if f_last else None},
            "false_offline": false_offline, "decisions": len(routed)}


def main() -> None:
    """Parse the options, measure, print JSON."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=20)
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="fenced-routing-switch-"))
    print(json.dumps(measure(args.workers, args.rate, args.seconds, log_dir)), flush=True)


if __name__ == "__main__":
    main()
