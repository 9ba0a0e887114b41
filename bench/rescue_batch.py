"""The cost of rescuing a dead holder's runs, wake-ups sent one by one or in one batch (issue 17).

`python -m bench.rescue_batch [--runs 300] [--rounds 3]`: `liveness.presume_dead` of a process that held
`--runs` leases, its wake-ups sent one Celery publish each, then inside one `tasks.wakeup.batch()` (as a
worker's liveness tick sends them), alternating; the wall and CPU time of the whole rescue and the
wake-ups found on the queue after it. FENCED_REDIS_URL is FLUSHED before each rescue: give it a scratch
Redis (the broker must be that Redis); FENCED_DB_URL receives the rescues' ledger entries.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from checkpoints import db
from fencing import keys, liveness
from fencing.connection import get_redis, process_token
from tasks import queues, wakeup


def _held_by_a_dead_process(dead: str, runs: int) -> list[str]:
    client = get_redis()
    client.flushdb()
    ids = [f"held-{i:04d}" for i in range(runs)]
    pipe = client.pipeline(transaction=False)
    for run_id in ids:
        pipe.set(keys.lease(run_id), f"{dead}/{run_id}", px=60_000)
        pipe.zadd(keys.lease_index(run_id), {keys.index_member(run_id, f"{dead}/{run_id}"): 2**40})
    pipe.sadd(keys.held_by(dead), *ids)
    pipe.execute()
    return ids


def rescue_once(runs: int, batched: bool, tag: str) -> dict[str, Any]:
    """One rescue of `runs` runs; what it cost and what reached the queue."""
    dead = f"{process_token()}-dead-{tag}"
    ids = _held_by_a_dead_process(dead, runs)
    wall, cpu = time.perf_counter(), time.process_time()
    if batched:
        with wakeup.batch():
            rescued = liveness.presume_dead(dead, wakeup.rescue)
    else:
        rescued = liveness.presume_dead(dead, wakeup.rescue)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"batched": batched, "runs": len(ids), "rescued": len(rescued),
            "queued": int(get_redis().llen(keys.broker_queue(queues.CONTINUE))),
            "wall_ms": round(wall * 1000, 1), "cpu_ms": round(cpu * 1000, 1)}


def measure(runs: int = 300, rounds: int = 3) -> list[dict[str, Any]]:
    db.migrate()
    return [rescue_once(runs, batched, f"{i}-{batched}") for i in range(rounds) for batched in (False, True)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.rescue_batch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = measure(args.runs, args.rounds)
    if args.json:
        print(json.dumps(rows))
        return
    for r in rows:
        print(f"{'one batch' if r['batched'] else 'one by one':10}  {r['rescued']}/{r['runs']} rescued, "
              f"{r['queued']} wake-ups queued, wall {r['wall_ms']:7.1f} ms, CPU {r['cpu_ms']:7.1f} ms")


if __name__ == "__main__":
    main()
