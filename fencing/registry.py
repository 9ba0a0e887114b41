"""The worker registry's Redis keys and reads/writes (routing/ builds on these); every key is {routing}-tagged.

What a worker is: a HASH of its metadata and last heartbeat, its entry in the WORKERS index (last beat
ms), its recent steps (a capped LIST), and the wake-ups routed to it and not yet consumed (a ZSET). The
registry is advice: losing all of it (a Redis wipe) routes nothing wrong, runs wait until the next
heartbeats and the sweeper wakes them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fenced_core.settings import get_settings
from fencing import keys
from fencing.broker import get_broker_redis
from fencing.connection import CLIENT_NAME_PREFIX, connected_names, get_redis
from fencing.turns import take_turn

TAG = "{routing}"
WORKERS = f"{keys.PREFIX}:{TAG}:workers"  # ZSET worker name -> last heartbeat ms (online and offline)
DEFERRED = f"{keys.PREFIX}:{TAG}:deferred"  # ZSET run_id -> ms it was deferred (no worker qualified)
DEFERRED_INFO = f"{keys.PREFIX}:{TAG}:deferred-info"  # HASH run_id -> JSON {step, reason, kind}
SCAN_LOCK = f"{keys.PREFIX}:{TAG}:scan-lock"  # one registry scan per interval across workers
FEED = f"{keys.PREFIX}:{TAG}:feed"  # STREAM of routing warnings (queue too long, worker offline), capped
FEED_KEEP = 1_000
QUEUE_LONG = f"{keys.PREFIX}:{TAG}:queue-long"  # HASH queue -> JSON of its warning: the queues over the threshold now
QUEUE_WARNINGS = f"{keys.PREFIX}:{TAG}:queue-warnings"  # HASH queue -> warnings raised so far (a counter)
SUSPECTS = f"{keys.PREFIX}:{TAG}:suspects"  # HASH worker -> registry scans in a row without its Redis connection
OFFLINE_KEEP_MS = 24 * 3_600_000  # offline workers stay listed this long, then go
OWN_QUEUE_PREFIX = "agents.w."  # a worker's own queue under `reach`: agents.w.<node name>
URGENT_SUFFIX = ".continue"  # its queue for continuations, rescues, replies and reroutes, consumed first


def urgent_queue(queue: str) -> str:
    """The queue beside a worker's own `queue` that it consumes first: every wake-up but a first one goes
    there, so a run's next step never waits behind new runs (as `agents.continue` under `shared`)."""
    return queue + URGENT_SUFFIX


def worker(name: str) -> str:
    """HASH of one worker: metadata, status, last beat, runs in flight, step stats."""
    return f"{keys.PREFIX}:{TAG}:worker:{name}"


def steps(name: str) -> str:
    """LIST of "ms:ok" (newest first, capped) of the worker's last steps."""
    return f"{keys.PREFIX}:{TAG}:steps:{name}"


def pending(name: str) -> str:
    """ZSET run_id -> routed ms: wake-ups routed to the worker's own queue that it has not consumed yet."""
    return f"{keys.PREFIX}:{TAG}:pending:{name}"


def now_ms() -> int:
    return int(time.time() * 1000)


def offline_after_ms() -> int:
    """A worker whose last beat is older than this is offline: 3 heartbeat periods plus the clock skew."""
    s = get_settings()
    return 3 * s.routing_heartbeat_ms + s.routing_skew_ms


@dataclass
class WorkerRecord:
    """One worker as the registry has it. `running` is the last beat's count corrected live by the
    worker's own task starts and ends; `queued` the wake-ups routed to it and not consumed yet."""

    name: str
    beat_ms: int
    fields: dict[str, str] = field(default_factory=dict)
    queued: int = 0
    presumed_dead_ms: int | None = None  # when fast takeover presumed its process dead (keys.PRESUMED_DEAD)

    @property
    def presumed_dead(self) -> bool:
        """Fast takeover presumed its process dead (no Redis connection) and it has not beaten since: a
        killed worker, seen within a liveness tick, seconds before the scan marks it offline."""
        return self.presumed_dead_ms is not None and self.presumed_dead_ms >= self.beat_ms

    @property
    def status(self) -> str:
        return self.fields.get("status", "online")

    @property
    def queue(self) -> str:
        return self.fields.get("queue", "")

    @property
    def running(self) -> int:
        return max(0, int(self.fields.get("running", "0") or 0))

    @property
    def concurrency(self) -> int:
        return int(self.fields.get("concurrency", "1") or 1)

    @property
    def avg_step_ms(self) -> float | None:
        value = self.fields.get("avg_step_ms", "")
        return float(value) if value else None

    @property
    def success_rate(self) -> float | None:
        value = self.fields.get("success_rate", "")
        return float(value) if value else None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "beat_ms": self.beat_ms, "queued": self.queued,
                               "running": self.running, "status": self.status}
        for k, v in self.fields.items():
            if k in ("queues", "labels"):
                out[k] = json.loads(v) if v else []
            else:
                out.setdefault(k, v)
        return out


def beat(name: str, fields: Mapping[str, Any]) -> None:
    """One heartbeat: the worker's fields (status online unless they say otherwise) and its index entry,
    in one transaction."""
    now = now_ms()
    data: dict[Any, Any] = {
        k: json.dumps(v) if isinstance(v, list | dict) else str(v) for k, v in fields.items()}
    data = {"status": "online", **data, "beat_ms": now}  # a draining worker says so in its fields
    pipe = get_redis().pipeline(transaction=True)
    pipe.hset(worker(name), mapping=data)
    pipe.hdel(worker(name), "offline_reason", "offline_ms")
    pipe.zadd(WORKERS, {name: now})
    pipe.execute()


def set_status(name: str, status: str) -> None:
    """Mark a worker (draining on a warm shutdown); the next beat sets it online again."""
    get_redis().hset(worker(name), "status", status)


def all_workers() -> list[WorkerRecord]:
    """Every registered worker (online and offline), with its live queued count and whether fast takeover
    presumed its process dead. Cost: O(workers + processes presumed dead in the last hour)."""
    client = get_redis()
    index: list[tuple[str, float]] = client.zrange(WORKERS, 0, -1, withscores=True)  # type: ignore[assignment]
    if not index:
        return []
    pipe = client.pipeline(transaction=False)
    for name, _ in index:
        pipe.hgetall(worker(name))
        pipe.zcard(pending(name))
    pipe.zrange(keys.PRESUMED_DEAD, 0, -1, withscores=True)
    replies = pipe.execute()
    dead = {token: int(ms) for token, ms in replies[-1]}
    out = []
    for i, (name, score) in enumerate(index):
        fields = replies[2 * i] or {}
        out.append(WorkerRecord(name, int(score), fields, int(replies[2 * i + 1]), dead.get(fields.get("token", ""))))
    return out


def stale(before_ms: int) -> list[str]:
    """Workers whose last beat is older than `before_ms` (online or not). Cost: O(log n + answer)."""
    return get_redis().zrangebyscore(WORKERS, "-inf", before_ms)  # type: ignore[return-value]


def mark_offline(name: str, reason: str) -> list[str] | None:
    """Mark `name` offline unless it already is; returns the wake-ups ("run_id|step") routed to it and not consumed
    (the pending set goes), or None if it was offline already. A later beat makes it online again. A
    scanner that dies after this and before resending them: those runs are woken by the reaper (a
    handoff's deadline) or the sweeper (no lease, no progress), as without routing."""
    client = get_redis()
    if client.hget(worker(name), "status") == "offline":
        return None
    pipe = client.pipeline(transaction=True)
    pipe.hset(worker(name), mapping={"status": "offline", "offline_reason": reason, "offline_ms": now_ms(),
                                     "running": 0})
    pipe.zrange(pending(name), 0, -1)
    pipe.delete(pending(name))
    return list(pipe.execute()[1])


def take_pending(name: str) -> list[str]:
    """The wake-ups ("run_id|step") routed to `name` and not consumed, taken out of its set (an offline
    worker's leftovers)."""
    pipe = get_redis().pipeline(transaction=True)
    pipe.zrange(pending(name), 0, -1)
    pipe.delete(pending(name))
    return list(pipe.execute()[0])


def forget(name: str) -> None:
    """Drop a worker that has been offline for OFFLINE_KEEP_MS."""
    pipe = get_redis().pipeline(transaction=True)
    pipe.zrem(WORKERS, name)
    pipe.delete(worker(name), steps(name), pending(name))
    pipe.execute()


def last_beat_ms(name: str) -> int | None:
    """`name`'s last heartbeat (ms) as the WORKERS index has it, None when it is not listed."""
    beat = get_redis().zscore(WORKERS, name)
    return None if beat is None else int(beat)


def connection_misses(tokens: Mapping[str, str]) -> dict[str, int]:
    """For each worker name -> process token: 0 when its process has a Redis connection now (every node's
    on a Redis Cluster), else the registry scans in a row that found none, this one included."""
    client = get_redis()
    connected = connected_names(client)
    seen = {name: CLIENT_NAME_PREFIX + token in connected for name, token in tokens.items()}
    pipe = client.pipeline(transaction=False)
    for name, ok in seen.items():
        if ok:
            pipe.hdel(SUSPECTS, name)
        else:
            pipe.hincrby(SUSPECTS, name, 1)
    return {name: 0 if ok else int(n) for (name, ok), n in zip(seen.items(), pipe.execute(), strict=True)}


def clear_suspect(name: str) -> None:
    """Forget `name`'s count of scans without a connection (it was marked offline, or is back)."""
    get_redis().hdel(SUSPECTS, name)


def pending_member(run_id: str, step: int | None) -> str:
    """The pending set's member for a wake-up of `run_id` at `step` ("run_id|step", "run_id|" for None)."""
    return f"{run_id}|{'' if step is None else step}"


def routed(name: str, run_id: str, step: int | None) -> int | None:
    """Record a wake-up routed to `name` (its queued count grows until it consumes it); returns the run's
    epoch as Redis mirrors it (None if unknown), read in the same round trip. A crash before the send
    leaves an entry with no message: the worker's next beat prunes it once its queue is empty."""
    pipe = get_redis().pipeline(transaction=False)
    pipe.zadd(pending(name), {pending_member(run_id, step): now_ms()})
    pipe.get(keys.epoch(run_id))
    mirror = pipe.execute()[1]
    return int(mirror) if mirror is not None else None


def epoch_mirror(run_id: str) -> int | None:
    value = get_redis().get(keys.epoch(run_id))
    return int(value) if value is not None else None


def consumed(name: str, run_id: str, step: int | None) -> None:
    """The worker took a wake-up off its queues and starts it: no longer queued, one more running."""
    pipe = get_redis().pipeline(transaction=False)
    pipe.zrem(pending(name), pending_member(run_id, step))
    pipe.hincrby(worker(name), "running", 1)
    pipe.execute()


def prune_pending(name: str, queue: str, before_ms: int) -> int:
    """Drop pending entries older than `before_ms` when the worker's queue is empty: their messages were
    taken (a lost `consumed`) or never sent (a router died between recording and sending). Returns how
    many went. An entry recorded after the queue was read is newer than `before_ms` and stays."""
    pipe = get_broker_redis().pipeline(transaction=False)
    pipe.llen(keys.broker_queue(queue))
    pipe.llen(keys.broker_queue(urgent_queue(queue)))
    if any(int(n) for n in pipe.execute()):
        return 0
    return int(get_redis().zremrangebyscore(pending(name), "-inf", before_ms))


def consumed_nothing(name: str, run_id: str, step: int | None) -> None:
    """Undo `routed` after a send that failed: nothing is queued for `name` after all."""
    get_redis().zrem(pending(name), pending_member(run_id, step))


def delivery_ended(name: str, step: tuple[float, bool] | None, window: int, *, running: bool) -> None:
    """A delivery ended on the worker, in one round trip: the step it closed (ms, ok), if any, joins the
    worker's last `window` steps; with `running`, one fewer running (the next beat writes the true count
    anyway)."""
    pipe = get_redis().pipeline(transaction=False)
    if running:
        pipe.hincrby(worker(name), "running", -1)
    if step is not None:
        pipe.lpush(steps(name), f"{step[0]:.0f}:{1 if step[1] else 0}")
        pipe.ltrim(steps(name), 0, window - 1)
    pipe.execute()


def step_stats(name: str, window: int) -> tuple[float | None, float | None, int]:
    """(average step ms, success rate, steps counted) over the worker's last `window` steps."""
    raw: list[str] = get_redis().lrange(steps(name), 0, window - 1)  # type: ignore[assignment]
    parsed = []
    for item in raw:
        ms, _, ok = item.partition(":")
        try:
            parsed.append((float(ms), ok == "1"))
        except ValueError:
            continue
    if not parsed:
        return None, None, 0
    oks = [ms for ms, ok in parsed if ok]
    avg = sum(oks) / len(oks) if oks else sum(ms for ms, _ in parsed) / len(parsed)
    return avg, len(oks) / len(parsed), len(parsed)


def defer(run_id: str, info: Mapping[str, Any]) -> None:
    """Park a wake-up nobody qualified for (no message anywhere); the scan routes it again. Lost with a
    Redis wipe or a crash before it: the run has no lease and no progress, so the sweeper wakes it."""
    pipe = get_redis().pipeline(transaction=True)
    pipe.zadd(DEFERRED, {run_id: now_ms()}, nx=True)
    pipe.hset(DEFERRED_INFO, run_id, json.dumps(dict(info)))
    pipe.execute()


def deferred(batch: int) -> list[tuple[str, dict[str, Any]]]:
    """The oldest `batch` deferred wake-ups with what they were for."""
    client = get_redis()
    run_ids: list[str] = client.zrange(DEFERRED, 0, batch - 1)  # type: ignore[assignment]
    if not run_ids:
        return []
    infos = client.hmget(DEFERRED_INFO, run_ids)
    return [(r, json.loads(i) if i else {}) for r, i in zip(run_ids, infos, strict=True)]


def undefer(run_ids: Iterable[str]) -> None:
    ids = list(run_ids)
    if ids:
        pipe = get_redis().pipeline(transaction=True)
        pipe.zrem(DEFERRED, *ids)
        pipe.hdel(DEFERRED_INFO, *ids)
        pipe.execute()


def deferred_count() -> int:
    return int(get_redis().zcard(DEFERRED))


def routed_backlog(beat_after_ms: int) -> tuple[list[str], int]:
    """Where wake-ups wait under `reach`, for admission's backlog, in one round trip: the own queue of every
    worker that beat after `beat_after_ms` (an offline one's leftovers were rerouted: stale, not waiting)
    and how many wake-ups are deferred (no worker qualified). O(log n + workers)."""
    pipe = get_redis().pipeline(transaction=False)
    pipe.zrangebyscore(WORKERS, beat_after_ms, "+inf")
    pipe.zcard(DEFERRED)
    names, count = pipe.execute()
    return [OWN_QUEUE_PREFIX + n for n in names], int(count)


def try_scan_lock(token: str, interval_ms: int) -> bool:
    """True for the one process that scans in this interval."""
    return take_turn(get_redis(), SCAN_LOCK, token, interval_ms)


def warn(event: Mapping[str, Any]) -> None:
    """Add a warning to the routing feed (capped stream)."""
    get_redis().xadd(FEED, {k: str(v) for k, v in event.items()}, maxlen=FEED_KEEP, approximate=True)


def feed(count: int = 50) -> list[dict[str, str]]:
    """The newest `count` routing warnings, newest first."""
    entries: list[tuple[str, dict[str, str]]] = get_redis().xrevrange(FEED, count=count)  # type: ignore[assignment]
    return [{"id": eid, **data} for eid, data in entries]


def feed_after(after_id: str, count: int = 200) -> list[dict[str, str]]:
    """Routing warnings added after stream id `after_id` (exclusive), oldest first."""
    entries: list[tuple[str, dict[str, str]]] = get_redis().xrange(  # type: ignore[assignment]
        FEED, min=f"({after_id}", max="+", count=count)
    return [{"id": eid, **data} for eid, data in entries]


def queue_long_raise(queue: str, event: Mapping[str, Any]) -> bool:
    """Mark `queue` over the warning threshold. True for the one caller that marked it (its warning then
    goes to the feed and is counted); False when it was marked already (several watchers, one warning)."""
    client = get_redis()
    if not client.hsetnx(QUEUE_LONG, queue, json.dumps(dict(event))):
        return False
    pipe = client.pipeline(transaction=False)
    pipe.xadd(FEED, {k: str(v) for k, v in event.items()}, maxlen=FEED_KEEP, approximate=True)
    pipe.hincrby(QUEUE_WARNINGS, queue, 1)
    pipe.execute()
    return True


def queue_long_clear(queue: str, event: Mapping[str, Any]) -> bool:
    """Unmark `queue` (back under the threshold); True for the one caller that unmarked it (its event
    then goes to the feed)."""
    client = get_redis()
    if not client.hdel(QUEUE_LONG, queue):
        return False
    warn(event)
    return True


def queues_long() -> dict[str, dict[str, Any]]:
    """The queues marked over the threshold now, with the warning that marked them."""
    raw: dict[str, str] = get_redis().hgetall(QUEUE_LONG)  # type: ignore[assignment]
    return {q: json.loads(v) for q, v in raw.items()}


def queue_warnings() -> dict[str, int]:
    """How many long-queue warnings each queue raised (since Redis last lost its data)."""
    raw: dict[str, str] = get_redis().hgetall(QUEUE_WARNINGS)  # type: ignore[assignment]
    return {q: int(n) for q, n in raw.items()}


def queue_depths(queues: Iterable[str]) -> dict[str, tuple[int, int | None]]:
    """queue -> (messages waiting, ms since the oldest was sent, if the sender stamped it)."""
    names = list(queues)
    if not names:
        return {}
    pipe = get_broker_redis().pipeline(transaction=False)
    for q in names:
        pipe.llen(keys.broker_queue(q))
        pipe.lindex(keys.broker_queue(q), -1)  # kombu LPUSHes and BRPOPs: the oldest is last
    replies = pipe.execute()
    now = now_ms()
    out: dict[str, tuple[int, int | None]] = {}
    for i, q in enumerate(names):
        length, oldest = int(replies[2 * i]), replies[2 * i + 1]
        lag = None
        if oldest:
            try:
                sent = json.loads(oldest).get("headers", {}).get("fenced_sent_ms")
                lag = now - int(sent) if sent else None
            except (ValueError, TypeError, AttributeError):
                lag = None
        out[q] = (length, lag)
    return out
