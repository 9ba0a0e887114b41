"""How detection costs grow with runs in flight: reaper, sweeper and liveness ticks at N simulated runs.

In-flight runs are simulated as what they are to the detectors: a live lease and its deadline-index
entry in Redis, and a `running` row in the database. For each N the ticks run here against the real
stores, and we count what they cost: wall time, Redis commands (server-side INFO commandstats), Redis
round trips (socket writes of this process) and SQL statements. Renewal batching is measured the same
way: one watchdog heartbeat over L leases of one process.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

TICKS = 15
EXPIRED_PER_TICK = 10
DEAD = "dead-host:9:dead"  # the process token of a holder that died


class Counters:
    """SQL statements and Redis round trips made by this process while active."""

    def __init__(self) -> None:
        self.sql = 0
        self.round_trips = 0


@contextmanager
def counting() -> Iterator[Counters]:
    import redis.connection
    from sqlalchemy import event

    from checkpoints.db import get_engine

    c = Counters()
    engine = get_engine()

    def on_sql(*_: Any) -> None:
        c.sql += 1

    original = redis.connection.AbstractConnection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        c.round_trips += 1
        original(self, command, check_health)

    event.listen(engine, "before_cursor_execute", on_sql)
    redis.connection.AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
    try:
        yield c
    finally:
        redis.connection.AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
        event.remove(engine, "before_cursor_execute", on_sql)


def server_commands() -> int:
    """Commands the Redis server processed so far, not counting INFO itself."""
    from fencing.cluster import is_cluster
    from fencing.connection import get_redis

    client: Any = get_redis()
    if is_cluster(client):  # every master's count (INFO alone asks one node)
        per_node = client.info("commandstats", target_nodes=client.PRIMARIES)
        return sum(v["calls"] for stats in per_node.values() for k, v in stats.items() if k != "cmdstat_info")
    stats: Any = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")


def tick_cost(fn: Callable[[], Any], before: Callable[[], Any] = lambda: None) -> dict[str, float]:
    """Median wall ms, Redis commands, round trips, SQL statements and runs rescued (the length of what
    `fn` returns) over TICKS ticks."""
    walls, cmds, trips, sql, found = [], [], [], [], []
    for _ in range(TICKS):
        before()
        start_cmds = server_commands()
        with counting() as c:
            t = time.perf_counter()
            out = fn()
            walls.append((time.perf_counter() - t) * 1000)
        found.append(len(out) if isinstance(out, list) else 0)
        cmds.append(server_commands() - start_cmds)
        trips.append(c.round_trips)
        sql.append(c.sql)
    return {"ms": round(statistics.median(walls), 2), "redis_cmds": statistics.median(cmds),
            "round_trips": statistics.median(trips), "sql": statistics.median(sql),
            "rescued": statistics.median(found)}


def seed(n: int) -> list[str]:
    """N in-flight runs: leases that live a minute, their index entries, and fresh `running` rows."""
    import sqlalchemy as sa

    from checkpoints.db import transaction
    from checkpoints.runs import now_ms
    from checkpoints.schema import run_checkpoints
    from fencing import keys
    from fencing.connection import get_redis

    client = get_redis()
    ids = [str(uuid.uuid4()) for _ in range(n)]
    now = now_ms()
    for chunk in range(0, n, 1000):
        part = ids[chunk:chunk + 1000]
        pipe = client.pipeline(transaction=False)
        for run_id in part:
            pipe.set(keys.lease(run_id), f"bench-host:1:feed/{run_id[:8]}", px=60_000)
        for run_id in part:
            pipe.zadd(keys.lease_index(run_id), {keys.index_member(run_id, f"bench-host:1:feed/{run_id[:8]}"):
                                                 now + 60_000})
        pipe.execute()
        with transaction() as conn:
            conn.execute(sa.insert(run_checkpoints), [dict(
                run_id=run_id, user_id="growth", kind="normal", query="q", state="running", epoch=1,
                owner="bench-host:1:feed/x", step=1, phase="done", checkpoint=None, prompt_tokens=0,
                completion_tokens=0, model_calls=0, last_event_id="", deliveries=1, total_deliveries=1,
                created_at_ms=now, updated_at_ms=now) for run_id in part])
    return ids


def age_rows() -> None:
    """Make every simulated run look quiet for an hour (as a long step's row does)."""
    import sqlalchemy as sa

    from checkpoints.db import transaction
    from checkpoints.runs import now_ms
    from checkpoints.schema import run_checkpoints

    with transaction() as conn:
        conn.execute(sa.update(run_checkpoints).where(run_checkpoints.c.user_id == "growth")
                     .values(updated_at_ms=now_ms() - 3_600_000))


def clear() -> None:
    import sqlalchemy as sa

    from checkpoints.db import transaction
    from checkpoints.schema import run_checkpoints
    from fencing.connection import get_redis

    get_redis().flushall()
    with transaction() as conn:
        conn.execute(sa.delete(run_checkpoints).where(run_checkpoints.c.user_id == "growth"))


def measure(sizes: tuple[int, ...]) -> dict[str, Any]:
    """Tick costs at every N in `sizes`, and the watchdog's batched renewal over 10/100/1,000 leases."""
    from fenced_core.settings import get_settings
    from fencing import keys, liveness, reaper, sweeper
    from fencing.connection import get_redis, process_token
    from fencing.lease import Lease, now_ms
    from fencing.watchdog import Watchdog

    s = get_settings()
    client = get_redis()
    rescued: list[str] = []

    def send(run_id: str) -> None:
        rescued.append(run_id)

    def expire_some() -> None:
        pipe = client.pipeline(transaction=False)
        for _ in range(EXPIRED_PER_TICK):
            member = str(uuid.uuid4())
            pipe.zadd(keys.lease_index(member), {member: now_ms() - 1})
        pipe.execute()

    def dead_holder() -> None:
        """Five leases taken by a process that then died (as Lease.acquire records them)."""
        for _ in range(5):
            assert Lease(str(uuid.uuid4()), 60_000, token=f"{DEAD}/{uuid.uuid4().hex[:6]}").acquire(None)

    rows: list[dict[str, Any]] = []
    for n in sizes:
        clear()
        seed(n)
        client.zadd(keys.PROCESSES, {process_token(): now_ms()})
        get_redis().ping()  # our named connection is open: the liveness check sees us alive
        row = {
            "in_flight": n,
            "reaper, none expired": tick_cost(lambda: reaper.reap(send, s.lease_ttl_ms)),
            f"reaper, {EXPIRED_PER_TICK} expired": tick_cost(lambda: reaper.reap(send, s.lease_ttl_ms), expire_some),
            "sweeper": tick_cost(lambda: sweeper.sweep(send, force=True)),
            "liveness check": tick_cost(lambda: liveness.check_connections(send),
                                        lambda: client.delete(keys.LIVENESS_LOCK)),
            "presumed dead (5 leases)": tick_cost(lambda: liveness.presume_dead(DEAD, send),
                                                  dead_holder),
        }
        # Steps longer than the sweeper's grace: every row looks quiet, every lease is live. The sweep
        # checks them (up to its limit) and must rescue none.
        age_rows()
        row["sweeper, every row quiet past its grace"] = tick_cost(lambda: sweeper.sweep(send, force=True))
        rows.append(row)
    clear()
    renewals = []
    wd = Watchdog(s.heartbeat_ms)  # not started: renew_all is called by hand
    for n in (10, 100, 1000):
        leases = [Lease(str(uuid.uuid4()), s.lease_ttl_ms) for _ in range(n)]
        for lease in leases:
            lease.acquire(0)
            wd.track(lease)
        renewals.append({"leases": n, **tick_cost(wd.renew_all)})
        for lease in leases:
            wd.untrack(lease)
    clear()
    return {"ticks": TICKS, "rows": rows, "renewal": renewals, "defaults": {
        "reaper_tick_ms": s.reaper_tick_ms, "sweeper_interval_ms": s.sweeper_interval_ms,
        "liveness_tick_ms": s.liveness_tick_ms, "heartbeat_ms": s.heartbeat_ms}}
