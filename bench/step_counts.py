"""What one fenced step asks of the stores: Redis round trips and commands, database round trips,
transactions and statements, counted over in-process deliveries (bench.breakdown.drive).

    python -m bench.step_counts --redis-url redis://127.0.0.1:PORT/0 --db-url mysql+pymysql://root@127.0.0.1:3306/DB

Both stores must be private to this command: the database is migrated and the Redis database
flushed. Redis commands are the server's own count (INFO commandstats, so the commands inside Lua
scripts are counted too); round trips are counted in the clients (redis-py's send, PyMySQL's query
and commit; a multi-statement query is one round trip). The broker's consuming side (a worker
receiving and acking the message) is not part of an in-process delivery and is not counted. The
README's scaling model is computed from these numbers.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def _counting() -> Iterator[collections.Counter[str]]:
    """Count round trips and statements in PyMySQL and redis-py while the block runs."""
    import pymysql.connections as pc
    import redis.connection as rc

    counts: collections.Counter[str] = collections.Counter()
    # Patched where each is defined, and put back there: setting the inherited send_packed_command on
    # Connection would leave a copy there that hides later patches of AbstractConnection (test_lua's).
    query, commit, send = pc.Connection.query, pc.Connection.commit, rc.AbstractConnection.send_packed_command

    def counted_query(self: Any, sql: Any, unbuffered: bool = False) -> Any:
        counts["db round trips"] += 1
        text = sql.decode() if isinstance(sql, bytes) else str(sql)
        for part in text.split(";"):
            words = part.split(None, 1)
            if words:
                counts[f"db {words[0].upper()}"] += 1
        return query(self, sql, unbuffered)

    def counted_commit(self: Any) -> Any:
        counts["db round trips"] += 1
        counts["db COMMIT"] += 1
        return commit(self)

    def counted_send(self: Any, command: Any, check_health: bool = True) -> Any:
        counts["redis round trips"] += 1
        return send(self, command, check_health)

    pc.Connection.query, pc.Connection.commit = counted_query, counted_commit
    rc.AbstractConnection.send_packed_command = counted_send  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        pc.Connection.query, pc.Connection.commit = query, commit
        rc.AbstractConnection.send_packed_command = send  # type: ignore[method-assign]


def _server_commands(client: Any) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in client.info("commandstats").items()}


def count(runs: int = 20, inline: int = 0) -> dict[str, Any]:
    """Drive `runs` four-step runs here and return per-step averages (the stores must be private);
    `inline`: the steps a delivery may run after its own (FENCED_INLINE_STEPS in a worker)."""
    import examples.shopping  # noqa: F401 - registers the agent the in-process deliveries run
    from bench.breakdown import drive
    from bench.work import QUERY
    from checkpoints.db import migrate
    from fencing.connection import get_redis
    from tasks import submit_run

    migrate()
    client = get_redis()
    client.flushdb()
    for i in range(2):  # warm connections and script caches
        drive(submit_run(f"warm-{i}-{time.time_ns()}", QUERY), lambda _ms: None)
    ids = [submit_run(f"count-{i}-{time.time_ns()}", QUERY) for i in range(runs)]
    steps = 0

    def each(_ms: float) -> None:
        nonlocal steps
        steps += 1

    before = _server_commands(client)
    with _counting() as counts:
        for run_id in ids:
            drive(run_id, each, inline=inline)
    after = _server_commands(client)
    if inline:  # each() counted deliveries; the rows say how many steps ran (a done run's step is its last)
        from checkpoints import runs as run_rows

        steps = sum(row.step + 1 for row in (run_rows.get_run(r) for r in ids) if row is not None)
    # INFO is this measurement's own call, and drive() deletes the queues it filled once per run
    commands = {k: after[k] - before.get(k, 0) for k in after if k != "info"}
    commands["del"] = commands.get("del", 0) - runs
    commands = {k: v for k, v in commands.items() if v}
    per = {k: round(v / steps, 2) for k, v in sorted(counts.items())}
    client.flushdb()
    return {"runs": runs, "inline": inline, "steps": steps, "per_step": per,
            "redis_commands_per_step": round(sum(commands.values()) / steps, 2),
            "redis_commands_by_name": {k: round(v / steps, 2) for k, v in sorted(commands.items())},
            "db_write_statements_per_step": round((counts["db INSERT"] + counts["db UPDATE"]) / steps, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.step_counts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", required=True, help="a private Redis database (flushed)")
    parser.add_argument("--db-url", required=True, help="a private MySQL/MariaDB database (migrated)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--inline", type=int, default=0, help="steps a delivery may run after its own (default 0)")
    args = parser.parse_args(argv)
    os.environ.update(FENCED_REDIS_URL=args.redis_url, FENCED_DB_URL=args.db_url, FENCED_STUB_STEP_MS="0")
    try:
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    print(json.dumps({"commit": commit, **count(args.runs, args.inline)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
