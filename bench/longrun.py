"""Long runs: does a step cost more, and write more, the longer its run is? (issue 17's growth target)

`measure(runs, steps)` submits `runs` runs of the `bench_steps` agent (bench/steps_agent.py: one model
call of 0 ms and one read-only tool returning ~0.4 KB per step) and drives every step here through
`tasks.delivery.deliver`, as a worker would, on MariaDB. For every delivery it records the wall and CPU
time and the bytes of every blob parameter the delivery sent to the database (counted at the driver:
whatever the checkpoint storage is, that is what the step wrote), and at the end reads back the stored
checkpoint of each `run_steps` row and the whole history of each run. Figures at steps 5, 20 and 50
(1-based; each the median over the runs and the step on either side of it), and the ratio of step 50
to step 5: flat is the goal.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

AT = (5, 20, 50)
STEPS = 52  # so that steps 49-51 are ordinary steps (the last delivery is the terminal write)
TARGET_RATIO = 1.5  # step 50 costs and writes at most this many times what step 5 does: "flat"


@contextmanager
def blob_bytes() -> Iterator[list[int]]:
    """Bytes of every `bytes` parameter this process sends to MariaDB, appended per statement (at the
    driver, PyMySQL's cursor and mysqlclient's alike: SQLAlchemy statements and the raw one-round-trip
    transactions)."""
    import pymysql.cursors

    cursors: list[Any] = [pymysql.cursors.Cursor]
    try:
        import MySQLdb.cursors

        cursors.append(MySQLdb.cursors.BaseCursor)
    except ImportError:  # mysqlclient is optional (the `fast` extra)
        pass
    seen: list[int] = []
    saved = [(cursor, cursor.execute, cursor.executemany) for cursor in cursors]

    def count(args: Any) -> int:
        values = args.values() if isinstance(args, dict) else (args if isinstance(args, list | tuple) else ())
        return sum(len(v) if isinstance(v, bytes | bytearray) else count(v) if isinstance(v, list | tuple) else 0
                   for v in values)

    def counting(execute: Any, executemany: Any) -> tuple[Any, Any]:
        def counted_execute(self: Any, query: Any, args: Any = None) -> Any:
            seen.append(count(args))
            return execute(self, query, args)

        def counted_many(self: Any, query: Any, args: Any) -> Any:
            seen.append(sum(count(a) for a in args or ()))
            return executemany(self, query, args)

        return counted_execute, counted_many

    for cursor, execute, executemany in saved:
        cursor.execute, cursor.executemany = counting(execute, executemany)
    try:
        yield seen
    finally:
        for cursor, execute, executemany in saved:
            cursor.execute, cursor.executemany = execute, executemany


def drive_long(run_id: str, steps: int) -> list[dict[str, float]]:
    """Deliver every step of `run_id` here; per delivery: wall ms, CPU ms, blob bytes written."""
    from fencing.connection import get_redis
    from tasks import queues
    from tasks.delivery import deliver

    sent: list[int] = []
    out: list[dict[str, float]] = []
    step = 0  # the first wake-up's step, as submit sends it
    for _ in range(steps):
        with blob_bytes() as seen:
            wall, cpu = time.perf_counter(), time.process_time()
            outcome = deliver(run_id, step, lambda _rid, s: sent.append(s))
            out.append({"wall_ms": (time.perf_counter() - wall) * 1000, "cpu_ms": (time.process_time() - cpu) * 1000,
                        "written_bytes": float(sum(seen))})
        if outcome == "done":
            break
        if outcome != "continue":
            raise RuntimeError(f"delivery of {run_id} step {step} ended {outcome}")
        step = sent[-1]
    get_redis().delete(queues.NORMAL, queues.CONTINUE)
    return out


def stored(run_id: str) -> dict[int, dict[str, int]]:
    """The checkpoint B blob of each step (stored bytes and its decoded JSON size), from run_steps."""
    import json

    import sqlalchemy as sa

    from checkpoints import codec
    from checkpoints.db import transaction
    from checkpoints.schema import run_steps

    with transaction(readonly=True) as conn:
        rows = conn.execute(sa.select(run_steps.c.step, run_steps.c.phase, run_steps.c.checkpoint)
                            .where(run_steps.c.run_id == run_id).order_by(run_steps.c.id)).all()
    done = {}
    for r in rows:
        if r.phase == "done" and r.checkpoint is not None:
            done[r.step + 1] = {"stored_bytes": len(r.checkpoint),
                                "json_bytes": len(json.dumps(codec.decode(r.checkpoint), separators=(",", ":")))}
    return done


def measure(runs: int = 6, steps: int = STEPS) -> dict[str, Any]:
    """`runs` runs of `steps` steps driven here; the figures at AT and their ratios."""
    from bench import steps_agent
    from checkpoints.runs import get_run
    from tasks.submit import submit_run

    per_run: list[list[dict[str, float]]] = []
    rows: list[dict[int, dict[str, int]]] = []
    history: list[int] = []  # entries in each finished run's history, read back as a resume would
    for i in range(runs + 1):  # the first warms up connections and caches
        run_id = submit_run(f"longrun-{i}-{time.time_ns()}", steps_agent.query(steps), agent=steps_agent.NAME)
        deliveries = drive_long(run_id, steps)
        if len(deliveries) != steps:
            raise RuntimeError(f"run {run_id} took {len(deliveries)} deliveries, not {steps}")
        if i:
            per_run.append(deliveries)
            rows.append(stored(run_id))
            run = get_run(run_id)
            history.append(len(run.checkpoint.get("history", [])) if run and run.state == "done" else -1)

    def at(n: int, key: str) -> float:
        values = [d[j][key] for d in per_run for j in (n - 2, n - 1, n) if 0 <= j < steps - 1]
        return round(statistics.median(values), 3)

    def stored_at(n: int, key: str) -> float:
        return statistics.median(r[n][key] for r in rows if n in r)

    figures = []
    for n in AT:
        figures.append({"step": n, "wall_ms": at(n, "wall_ms"), "cpu_ms": at(n, "cpu_ms"),
                        "written_bytes": at(n, "written_bytes"),
                        "checkpoint_b_stored_bytes": stored_at(n, "stored_bytes"),
                        "checkpoint_b_json_bytes": stored_at(n, "json_bytes")})
    first, last = figures[0], figures[-1]
    ratios = {k: round(last[k] / first[k], 2) if first[k] else None
              for k in ("wall_ms", "cpu_ms", "written_bytes", "checkpoint_b_stored_bytes")}
    return {"runs": runs, "steps": steps, "deliveries": sum(len(d) for d in per_run), "history_entries": history,
            "at": figures,
            "ratio_last_to_first": ratios, "target_ratio": TARGET_RATIO,
            "met": all(ratios[k] is not None and ratios[k] <= TARGET_RATIO  # type: ignore[operator]
                       for k in ("written_bytes", "cpu_ms"))}
