"""The operator overview's Redis reads: lease-holding processes, leases left, and many runs' streams tailed.

Read-only and off the workers' hot path: nothing here is written by a worker for the overview's sake
(the one counter it shows, lease renew failures, rides in the watchdog's existing renewal pipeline and
changes only when a renewal fails). Everything is a notice that may be lost with Redis; the run rows
are the truth."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import redis

from fencing import keys
from fencing.connection import CLIENT_NAME_PREFIX, connected_names, get_redis
from fencing.events import Event, read_streams


@dataclass(frozen=True)
class Process:
    """A process that took a lease (fast takeover's registry, `keys.PROCESSES`), or was presumed dead.

    `alive`: it has a named Redis connection now (the test fast takeover uses); `last_seen_ms`: its
    last lease take or renewal (the heartbeat, while it holds leases); `runs`: the runs whose lease
    it holds right now (its own set, checked against each lease's value); `renew_failures`: renewals
    its watchdog could not make (lease gone or Redis unreachable), as it last reported them."""

    token: str
    host: str
    pid: int
    alive: bool
    last_seen_ms: int | None
    presumed_dead_at_ms: int | None
    renew_failures: int
    runs: list[str] = field(default_factory=list)


def _split(token: str) -> tuple[str, int]:
    host, _, rest = token.partition(":")
    pid = rest.split(":", 1)[0]
    return host, int(pid) if pid.isdigit() else 0


def processes(client: redis.Redis | None = None, dead_window_ms: int = 600_000,
              now_ms: int | None = None) -> list[Process]:
    """Every registered lease holder and every process presumed dead within `dead_window_ms`.

    Cost: CLIENT LIST (O(connections)), the registry, and one SMEMBERS per process plus one GET per
    run it recorded taking. Call it once a second at most."""
    import time

    client = client or get_redis()
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    pipe.zrange(keys.PROCESSES, 0, -1, withscores=True)
    pipe.zrangebyscore(keys.PRESUMED_DEAD, now - dead_window_ms, "+inf", withscores=True)
    pipe.hgetall(keys.RENEW_FAILURES)
    registered, dead, failures = pipe.execute()
    connected = connected_names(client)
    seen = {token: int(ms) for token, ms in registered}
    presumed = {token: int(ms) for token, ms in dead}
    tokens = sorted(set(seen) | set(presumed))
    pipe = client.pipeline(transaction=False)
    for token in tokens:
        pipe.smembers(keys.held_by(token))
    held = [sorted(m) for m in pipe.execute()]
    pipe = client.pipeline(transaction=False)
    for runs in held:
        for run_id in runs:
            pipe.get(keys.lease(run_id))
    values = iter(pipe.execute())
    out = []
    for token, runs in zip(tokens, held, strict=True):
        mine = [r for r in runs if (next(values) or "").startswith(token + "/")]
        host, pid = _split(token)
        alive = CLIENT_NAME_PREFIX + token in connected
        out.append(Process(token, host, pid, alive, seen.get(token), presumed.get(token),
                           int(failures.get(token, 0)), mine))
    return out


def lease_left_ms(run_ids: list[str], client: redis.Redis | None = None) -> dict[str, int]:
    """Milliseconds left on each run's lease (or handoff); a run with no lease is left out."""
    if not run_ids:
        return {}
    pipe = (client or get_redis()).pipeline(transaction=False)
    for run_id in run_ids:
        pipe.pttl(keys.lease(run_id))
    return {r: int(ms) for r, ms in zip(run_ids, pipe.execute(), strict=True) if int(ms) >= 0}


def newest_id(run_ids: list[str], client: redis.Redis | None = None) -> dict[str, str]:
    """Each run's newest stream id ("0-0" for an empty or lost stream): where tailing starts."""
    if not run_ids:
        return {}
    pipe = (client or get_redis()).pipeline(transaction=False)
    for run_id in run_ids:
        pipe.xrevrange(keys.events(run_id), count=1)
    return {r: (found[0][0] if found else "0-0") for r, found in zip(run_ids, pipe.execute(), strict=True)}


def recent(run_ids: list[str], per_run: int, client: redis.Redis | None = None) -> dict[str, list[Event]]:
    """The newest `per_run` events of each run, oldest first (an overview's first screen of its feed)."""
    if not run_ids:
        return {}
    pipe = (client or get_redis()).pipeline(transaction=False)
    for run_id in run_ids:
        pipe.xrevrange(keys.events(run_id), count=per_run)
    return {r: [_event(i, f) for i, f in reversed(found)] for r, found in zip(run_ids, pipe.execute(), strict=True)}


def tail(positions: dict[str, str], block_ms: int, count: int = 500,
         client: redis.Redis | None = None) -> dict[str, list[Event]]:
    """Events appended after `positions` (run id -> stream id, exclusive), waiting up to `block_ms` for
    the first one: one XREAD over every stream named on one Redis; on a Redis Cluster, whose streams'
    hash tags differ, a poll of one XREAD per stream (fencing.events.read_streams)."""
    if not positions:
        return {}
    streams = {keys.events(r): pos for r, pos in positions.items()}
    found = read_streams(client or get_redis(), streams, block_ms, count=count)
    out: dict[str, list[Event]] = {}
    for key, entries in found:
        run_id = key.split("{", 1)[1].rsplit("}", 1)[0]
        out[run_id] = [_event(i, f) for i, f in entries]
    return out


def false_positives(client: redis.Redis | None = None) -> int:
    """Processes presumed dead by fast takeover that turned out alive (a counter since Redis started)."""
    return int((client or get_redis()).get(keys.FALSE_POSITIVES) or 0)


def _event(stream_id: str, f: dict[str, str]) -> Event:
    return Event(f["eid"], f["type"], int(f["step"]), int(f["epoch"]), json.loads(f["data"]), stream_id)
