"""Instructions one fenced step costs this process, counted by valgrind's callgrind: a figure that does
not move with the machine's load (the CPU-time figures of `bench.breakdown` range ±30 % between runs on
a shared VM), for comparing two versions of the code or of a library.

    python -m bench.step_instructions --redis-url redis://127.0.0.1:PORT/0 \\
        --db-url mysql+pymysql://root@127.0.0.1:3306/DB [--runs 5 --runs 25]

Each `--runs N` is one process under callgrind that submits and delivers 3 + N zero-latency 4-step runs
in process (bench.breakdown.drive, FENCED_INLINE_STEPS=8, logs at WARNING); instructions per step are
the difference between the largest and the smallest N over the steps between them, so the start-up
(imports, connections, the warm-up runs) cancels out. Only this process is counted: the database and
Redis servers are not (`bench.cpu_split` measures those). Both stores must be private to this command
(the database is migrated, the runs stay in it); needs `valgrind` (Debian's package).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.work import STEPS_PER_RUN

WARM_RUNS = 3


def deliver_here(runs: int) -> None:
    """The counted body: WARM_RUNS + `runs` runs submitted and delivered in this process."""
    import examples.shopping  # noqa: F401 - registers the agent the in-process deliveries run
    from bench.breakdown import drive
    from bench.work import QUERY
    from checkpoints.db import migrate
    from fenced_core.settings import get_settings
    from tasks import submit_run

    migrate()
    inline = get_settings().inline_steps  # as a worker would, FENCED_INLINE_STEPS (main sets 8)
    for i in range(WARM_RUNS + runs):
        drive(submit_run(f"instr-{i}-{time.time_ns()}", QUERY), lambda _ms: None, inline=inline)


def instructions(runs: int, env: dict[str, str]) -> int:
    """Instructions callgrind counted in one process delivering WARM_RUNS + `runs` runs."""
    with tempfile.TemporaryDirectory(prefix="fenced-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                               "-m", "bench.step_instructions", "--deliver", str(runs)],
                              env=env, capture_output=True, text=True, check=False)
        found = re.search(r"Collected : (\d+)", proc.stderr)
        if proc.returncode != 0 or found is None:
            raise SystemExit(f"callgrind run of {runs} runs failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.step_instructions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", help="a private Redis database")
    parser.add_argument("--db-url", help="a private MySQL/MariaDB database or SQLite file (migrated)")
    parser.add_argument("--runs", type=int, action="append", help="runs per counted process (repeat; default 5 and 25)")
    parser.add_argument("--deliver", type=int, help=argparse.SUPPRESS)  # the body run under callgrind
    args = parser.parse_args(argv)
    if args.deliver is not None:
        deliver_here(args.deliver)
        return 0
    if not args.redis_url or not args.db_url:
        parser.error("--redis-url and --db-url are required")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    sizes = sorted(set(args.runs or [5, 25]))
    if len(sizes) < 2 or min(sizes) < 1:
        parser.error("give at least two different --runs sizes, each >= 1")
    env = {**os.environ, "FENCED_REDIS_URL": args.redis_url, "FENCED_DB_URL": args.db_url,
           "FENCED_STUB_STEP_MS": "0", "FENCED_INLINE_STEPS": "8", "FENCED_LOG_LEVEL": "WARNING"}
    # Migrated once, uncounted: each counted process then finds the schema at head, as the other does.
    subprocess.run([sys.executable, "-m", "bench.step_instructions", "--deliver", "0"], env=env, check=True)
    counted = {n: instructions(n, env) for n in sizes}
    steps = (sizes[-1] - sizes[0]) * STEPS_PER_RUN
    per_step = (counted[sizes[-1]] - counted[sizes[0]]) / steps
    from bench.stores import machine

    print(json.dumps({"instructions_per_step": round(per_step), "steps_between": steps,
                      "instructions_by_runs": counted, "machine": machine()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
