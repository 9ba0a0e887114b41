"""The peer: the same 4-step agent as a DBOS Transact workflow on PostgreSQL (benchmark-only dependency).

`python -m bench.dbos_app --db-url postgresql://... --concurrency 4 --executor-id w1` runs one DBOS
process that dequeues `agent_run` workflows from the `bench` queue until SIGTERM. Every step's output
is checkpointed by DBOS in the system database, as fenced checkpoints each of its steps.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

QUEUE = "bench"
WORKFLOW = "agent_run"
POLL_S = 0.01  # DBOS defaults to 1 s per queue poll; 10 ms keeps polling out of its throughput


def build(db_url: str, executor_id: str) -> Any:
    """Create the DBOS instance and register the workflow (before launch, as DBOS requires)."""
    from dbos import DBOS

    from bench.work import agent_step

    DBOS(config={"name": "fenced-bench", "system_database_url": db_url, "executor_id": executor_id,
                 "log_level": "WARNING"})

    @DBOS.step(name="agent_step")
    def step_fn(run_id: str, step: int, history: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
        return agent_step(run_id, step, history)

    @DBOS.workflow(name=WORKFLOW)
    def agent_run(run_id: str) -> str:
        history: list[dict[str, Any]] = []
        step = 0
        while True:
            history, answer = step_fn(run_id, step, history)
            if answer is not None:
                return answer
            step += 1

    return DBOS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dbos_app")
    p.add_argument("--db-url", required=True)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--executor-id", default="bench-1")
    args = p.parse_args(argv)
    dbos = build(args.db_url, args.executor_id)
    dbos.launch()
    dbos.register_queue(QUEUE, worker_concurrency=args.concurrency, polling_interval_sec=POLL_S,
                        on_conflict="always_update")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("dbos worker ready.", flush=True)
    stop.wait()
    dbos.destroy(workflow_completion_timeout_sec=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
