"""What a round trip shared by many runs would save: client CPU per write, alone in its round trip and
batched with others (issue 17: the lead after the per-layer profile of 2026-12-03).

    python -m bench.batching --redis-url redis://127.0.0.1:PORT/0 --db-url mysql+pymysql://root@127.0.0.1:3306/DB

- Redis: a step's event append (the fenced `append_event` script, as `fencing.events.Appends` sends it)
  `n` per pipeline, for n in --redis-batches; the streams it writes (keys `fenced:{bench-batching-*}:*`)
  are deleted afterwards.
- MariaDB/MySQL: checkpoint A's statements (`checkpoints.runs._RAW_CHECKPOINT_A`, as the hot path sends
  them) `n` transactions' worth per query, for n in --sql-batches, fenced by a run id that does not exist:
  every UPDATE matches nothing and nothing is written (the client still sends, and parses a result for,
  every statement).

Each figure is the median over --rounds of `time.process_time()` per write (µs), rounds of different
batch sizes alternating, so the machine's drift hits them alike. Nothing here batches anything in the
product: it measures what batching would be worth before anyone builds it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

RUN_PREFIX = "bench-batching-"


def _median_us(fns: dict[int, Callable[[], None]], per_call: dict[int, int], rounds: int,
               repeat: int) -> dict[int, float]:
    """Median client CPU (µs) per write for each batch size, rounds alternating between the sizes."""
    samples: dict[int, list[float]] = {n: [] for n in fns}
    for fn in fns.values():
        fn()  # warm: scripts loaded, connection open, statements cached
    for _ in range(rounds):
        for n, fn in fns.items():
            start = time.process_time()
            for _ in range(repeat):
                fn()
            samples[n].append((time.process_time() - start) * 1e6 / repeat / per_call[n])
    return {n: round(statistics.median(v), 1) for n, v in samples.items()}


def redis_appends(batches: list[int], rounds: int, repeat: int) -> dict[str, Any]:
    """Client CPU per event append, `n` appends (n runs, one event each) per pipeline."""
    from fencing import keys
    from fencing.connection import get_redis
    from fencing.events import Appends
    from fencing.scripts import scripts_for

    client = get_redis()
    registered = scripts_for(client)
    data = {"name": "search", "text": "x" * 80, "tool_calls": [{"id": "c1", "name": "search", "args": {"q": "lamp"}}]}

    def batch(n: int) -> Callable[[], None]:
        # Two sets of calls, sent in turn: an append repeating its stream's newest event (same id, same
        # epoch) is that entry, not a new one (append_event.lua), so consecutive appends must differ.
        def calls(side: str) -> list[Any]:
            events = [Appends(f"{RUN_PREFIX}{i}", 1, [(f"e{i}-{n}{side}", "model_decision", 1, data)])
                      for i in range(n)]
            return [call for appends in events for call in appends.calls()]

        turns = itertools.cycle([calls("a"), calls("b")])

        def send() -> None:
            replies = registered.execute_all(client, next(turns))
            if len(replies) != n or any(r is None for r in replies):
                raise AssertionError(f"a batch of {n} appends came back {replies!r}")

        return send

    try:
        per_append = _median_us({n: batch(n) for n in batches}, {n: n for n in batches}, rounds, repeat)
        appended = sum(int(client.xlen(keys.events(f"{RUN_PREFIX}{i}"))) for i in range(max(batches)))
    finally:
        for i in range(max(batches)):
            client.delete(keys.events(f"{RUN_PREFIX}{i}"), keys.epoch(f"{RUN_PREFIX}{i}"))
    return {"per_append_us": per_append, "appended": appended}


def sql_checkpoints(batches: list[int], rounds: int, repeat: int) -> dict[str, Any]:
    """Client CPU per checkpoint A, `n` transactions' statements per query (fenced on no run: no writes)."""
    from checkpoints.db import raw_txn, results
    from checkpoints.runs import _RAW_CHECKPOINT_A

    blob = bytes(range(256)) * 3  # a compressed checkpoint's size on the demo agent
    params = (blob, 10, 20, 1, "1796284578385-2", 123456, f"{RUN_PREFIX}none", 3,
              1, 3, "decided", "bench:1:batching", 10, 20, 123456, f"{RUN_PREFIX}none")
    one = _RAW_CHECKPOINT_A.removesuffix("; COMMIT") + ";"
    matched: list[int] = []

    def batch(n: int) -> Callable[[], None]:
        sql, args = " ".join([one] * n) + " COMMIT", params * n

        def send() -> None:
            with raw_txn() as cur:
                cur.execute(sql, args)
                out = results(cur)
            if len(out) != 3 * n + 1:
                raise AssertionError(f"{n} transactions' statements gave {len(out)} results")
            matched.append(sum(rowcount for rowcount, _id, _rows in out[0::3][:n]))

        return send

    per_checkpoint = _median_us({n: batch(n) for n in batches}, {n: n for n in batches}, rounds, repeat)
    return {"per_checkpoint_us": per_checkpoint, "rows_matched": sum(matched)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.batching", description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-url", required=True, help="a Redis this command may write to (keys are removed)")
    ap.add_argument("--db-url", required=True, help="a MySQL/MariaDB URL with the fenced schema (nothing is written)")
    ap.add_argument("--redis-batches", default="1,10,50")
    ap.add_argument("--sql-batches", default="1,10")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--repeat", type=int, default=200, help="batches sent per round and size")
    args = ap.parse_args(argv)
    if not args.db_url.startswith("mysql"):
        ap.error("--db-url: a MySQL/MariaDB URL (SQLite has no round trips to share)")
    os.environ.update(FENCED_REDIS_URL=args.redis_url, FENCED_DB_URL=args.db_url)
    from harness.embedded import reload_settings

    reload_settings()
    redis_batches = [int(n) for n in args.redis_batches.split(",")]
    sql_batches = [int(n) for n in args.sql_batches.split(",")]
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": args.rounds,
              "repeat": args.repeat, "redis": redis_appends(redis_batches, args.rounds, args.repeat),
              "sql": sql_checkpoints(sql_batches, args.rounds, max(1, args.repeat // 2))}
    print(json.dumps(result))
    for n, us in result["redis"]["per_append_us"].items():
        print(f"event appends, {n} per round trip: {us} µs of client CPU each", file=sys.stderr)
    for n, us in result["sql"]["per_checkpoint_us"].items():
        print(f"checkpoint A, {n} per query: {us} µs of client CPU each", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
