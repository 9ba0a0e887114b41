"""The operator overview's hub: one thread per API process reads the stores and pushes increments to every dashboard.

What it reads, and what that costs (nothing on the workers' hot path: no worker writes anything for it):
- runs: run rows whose `updated_at_ms` moved (one range query on the (state, updated_at_ms) index per
  tick; every write of a run row sets it), lease time left (one PTTL per live run every WORKERS_EVERY_S);
- the live feed: one XREAD (blocking up to TICK_MS) over the event streams of the live and recently
  ended runs, from where the hub last read each: the runs' own streams, so a takeover's `task_resumed`
  appears as its new holder appends it;
- workers: fencing.overview.processes (fast takeover's registry, CLIENT LIST, each process's lease set)
  every WORKERS_EVERY_S; the routing registry with each worker's score and factors (routing.view, the
  computation `fenced workers` shows) every WORKERS_EVERY_S, pushed per worker that changed; the queue
  watch (routing.queue_watch: length and lag of every queue, a warning past the threshold) and the
  routing feed (those warnings, workers gone offline) into the live feed, every WORKERS_EVERY_S;
  per-state counts at most every WORKERS_EVERY_S while runs change (and every
  SLOW_EVERY_S); dead letters every SLOW_EVERY_S (or at once when a run went dead).
A client gets a snapshot, then only what changed. The hub runs while at least one client listens; its
state is rebuilt from the stores when it starts, so a crashed or restarted API process loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from dataclasses import asdict
from typing import Any

import sqlalchemy as sa
import structlog

from checkpoints.db import transaction
from checkpoints.schema import RUN_STATES, TERMINAL_STATES, run_checkpoints
from fencing import overview, registry
from fencing.events import Event
from routing import queue_watch, view
from tasks import queues, service

log = structlog.get_logger("fenced_api.overview")
TICK_MS = 250  # the longest an event waits in Redis before the hub pushes it
WORKERS_EVERY_S = 1.0
SLOW_EVERY_S = 5.0
RECENT_ENDED = 50  # ended runs kept in the runs table beside every live one
MAX_LIVE = 500  # live runs shown (and tailed) at most: the newest by last progress
FEED_KEEP = 200  # feed entries a new client's snapshot starts with
CLIENT_QUEUE = 1000  # messages a slow client may fall behind before it is dropped
LEASE_MOVED_MS = 300  # a lease deadline that moved less than this is not pushed (the page counts down)
OVERLAP_MS = 5_000  # rows are re-read this far back: a commit can land after a later-stamped one
_RC = run_checkpoints.c
_COLUMNS = (_RC.run_id, _RC.user_id, _RC.agent, _RC.kind, _RC.query, _RC.state, _RC.epoch, _RC.owner, _RC.step,
            _RC.phase, _RC.deliveries, _RC.error_class, _RC.created_at_ms, _RC.updated_at_ms, _RC.finished_at_ms)


def _row(r: Any) -> dict[str, Any]:
    row = dict(r)
    row["query"] = row["query"][:300]
    row["lease_deadline_ms"] = None  # filled in by the hub from the lease's time left
    return row


def routing_event(entry: dict[str, str]) -> dict[str, Any]:
    """A routing feed entry (registry.FEED: a long queue, a queue back to normal, a worker offline) as a
    live-feed item: no run, its kind as the type, its fields as the data."""
    data = {k: v for k, v in entry.items() if k != "id"}
    return {"run_id": "", "eid": entry["id"], "type": data.get("kind", "routing"), "step": 0, "epoch": 0,
            "data": data, "stream_id": entry["id"], "at_ms": int(entry["id"].split("-")[0] or 0)}


def event_dict(run_id: str, e: Event) -> dict[str, Any]:
    """An event as the dashboard receives it (data left as recorded: the page shows it as text)."""
    return {"run_id": run_id, "eid": e.eid, "type": e.type, "step": e.step, "epoch": e.epoch,
            "data": e.data, "stream_id": e.stream_id, "at_ms": int(e.stream_id.split("-")[0] or 0)}


class Client:
    """One dashboard connection: a bounded queue the hub fills from its thread; `dropped` once it overflowed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(CLIENT_QUEUE)
        self.dropped = False

    def put(self, message: dict[str, Any]) -> None:
        def put() -> None:
            if self.dropped:
                return
            try:
                self.queue.put_nowait(message)
            except asyncio.QueueFull:  # never grow without bound: the socket is closed, the page resyncs
                self.dropped = True
                with contextlib.suppress(asyncio.QueueFull):
                    self.queue.get_nowait()
                    self.queue.put_nowait({"type": "dropped"})
        with contextlib.suppress(RuntimeError):  # the client's loop closed
            self.loop.call_soon_threadsafe(put)


class Hub:
    """The overview state of this API process, kept current by one thread while clients listen."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # the thread holds it while it changes the state
        self.clients: set[Client] = set()
        self.runs: dict[str, dict[str, Any]] = {}
        self.workers: list[dict[str, Any]] = []
        self.routing: dict[str, Any] = {}  # routing.view.snapshot(): policy, weights, workers with scores
        self.queues: list[dict[str, Any]] = []  # the queue watch: length, lag, long per queue
        self.feed_pos = "0-0"  # the last routing feed entry read
        self.dead_letters: list[dict[str, Any]] = []
        self.counters: dict[str, Any] = {}
        self.feed: deque[dict[str, Any]] = deque(maxlen=FEED_KEEP)
        self.positions: dict[str, str] = {}
        self.gone: dict[str, int] = {}  # run id -> updated_at_ms when _prune let it go
        self.since_ms = 0
        self.thread: threading.Thread | None = None
        self.next_workers = self.next_slow = self.next_count = 0.0
        self.stale = False
        self.seen = {"events": 0, "takeovers": 0}

    # -- clients ------------------------------------------------------------------------------------
    def join(self, loop: asyncio.AbstractEventLoop) -> Client:
        """A new client; its first message is a snapshot of the state as the hub knows it now."""
        client = Client(loop)
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self._load()
                self.thread = threading.Thread(target=self._loop, name="fenced-overview", daemon=True)
                self.thread.start()
            client.put(self.snapshot())
            self.clients.add(client)
        return client

    def leave(self, client: Client) -> None:
        with self.lock:
            self.clients.discard(client)

    def snapshot(self) -> dict[str, Any]:
        return {"type": "snapshot", "now_ms": _now(), "runs": list(self.runs.values()), "workers": self.workers,
                "routing": self.routing, "queues": self.queues,
                "feed": list(self.feed), "dead_letters": self.dead_letters, "counters": self.counters}

    def _send(self, message: dict[str, Any]) -> None:
        with self.lock:
            clients = list(self.clients)
        for client in clients:
            client.put(message)

    # -- the thread ---------------------------------------------------------------------------------
    def _load(self) -> None:
        """The state from scratch (the hub's start): live runs and the last ended ones, their recent events."""
        rows: list[dict[str, Any]] = []
        with transaction(readonly=True) as conn:
            for state in RUN_STATES:
                limit = RECENT_ENDED if state in TERMINAL_STATES else MAX_LIVE
                q = (sa.select(*_COLUMNS).where(_RC.state == state).order_by(_RC.updated_at_ms.desc()).limit(limit))
                rows += [_row(r) for r in conn.execute(q).mappings()]
        ended = sorted((r for r in rows if r["state"] in TERMINAL_STATES), key=lambda r: -r["updated_at_ms"])
        live = [r for r in rows if r["state"] not in TERMINAL_STATES]
        self.runs = {r["run_id"]: r for r in live + ended[:RECENT_ENDED]}
        self.gone = {}
        self.since_ms = max((r["updated_at_ms"] for r in rows), default=_now())
        self._leases()
        ids = list(self.runs)
        self.positions = overview.newest_id(ids)
        recent = overview.recent(ids, 10)
        feed = sorted((event_dict(r, e) for r, evs in recent.items() for e in evs), key=_order)
        warnings = registry.feed(20)
        self.feed_pos = warnings[0]["id"] if warnings else "0-0"
        feed = sorted(feed + [routing_event(w) for w in warnings], key=_order)
        self.feed = deque(feed[-FEED_KEEP:], maxlen=FEED_KEEP)
        self.workers = self._workers()
        self.routing = view.snapshot()
        self.queues = self._queues()
        self.dead_letters = self._dead_letters()
        self.counters = self._counters()

    def _loop(self) -> None:
        self.next_workers = self.next_slow = self.next_count = time.monotonic()
        while True:
            with self.lock:
                if not self.clients:
                    self.thread = None
                    return
            try:
                if self.positions:
                    found = overview.tail(dict(self.positions), TICK_MS)
                else:
                    found = {}
                    time.sleep(TICK_MS / 1000)
                with self.lock:
                    self._tick(found)
            except Exception as exc:  # a store outage: say so, keep trying; the clients keep their view
                log.warning("overview_tick_failed", error=repr(exc))
                self._send({"type": "error", "error": f"{type(exc).__name__}: {exc}"})
                time.sleep(1)

    def _tick(self, found: dict[str, list[Event]]) -> None:
        """One round under the lock: new events, changed rows and leases, and (when due) workers,
        dead letters and counters; each pushed only when it changed."""
        if found:
            self._events(found)
        changed = self._changed_runs()
        now = time.monotonic()
        if now >= self.next_workers:
            self.next_workers = now + WORKERS_EVERY_S
            moved = [self.runs[r] for r in self._leases()]
            if moved:
                self._send({"type": "runs", "now_ms": _now(), "runs": moved})
            workers = self._workers()
            if workers != self.workers:
                self.workers = workers
                self._send({"type": "workers", "now_ms": _now(), "workers": workers})
            self._routing()
        if changed or found:
            self.stale = True  # the counts moved: recount at the next workers' round, not every tick
        slow = now >= self.next_slow or any(r["state"] == "dead" for r in changed)
        if slow:
            self.next_slow = now + SLOW_EVERY_S
            dead = self._dead_letters()
            if dead != self.dead_letters:
                self.dead_letters = dead
                self._send({"type": "dead_letters", "dead_letters": dead})
        if slow or (self.stale and now >= self.next_count):
            self.next_count, self.stale = now + WORKERS_EVERY_S, False
            counters = self._counters()
            if counters != self.counters:
                self.counters = counters
                self._send({"type": "counters", "counters": counters})

    def _events(self, found: dict[str, list[Event]]) -> None:
        out = []
        for run_id, evs in found.items():
            self.positions[run_id] = evs[-1].stream_id
            out += [event_dict(run_id, e) for e in evs]
        out.sort(key=_order)
        self.feed.extend(out)
        self.seen["events"] += len(out)
        self.seen["takeovers"] += sum(d["type"] == "task_resumed" for d in out)
        self._send({"type": "events", "events": out})

    def _changed_runs(self) -> list[dict[str, Any]]:
        """Rows written since the last read (re-read OVERLAP_MS back), pushed when they differ."""
        since = self.since_ms - OVERLAP_MS
        with transaction(readonly=True) as conn:
            q = (sa.select(*_COLUMNS).where(_RC.state.in_(RUN_STATES), _RC.updated_at_ms >= since)
                 .order_by(_RC.updated_at_ms).limit(2000))
            rows = [_row(r) for r in conn.execute(q).mappings()]
        changed = []
        for row in rows:
            self.since_ms = max(self.since_ms, row["updated_at_ms"])
            old = self.runs.get(row["run_id"])
            if old is None and self.gone.get(row["run_id"]) == row["updated_at_ms"]:
                continue  # let go by _prune and not written since
            if old and row["state"] in ("queued", "running"):
                row["lease_deadline_ms"] = old.get("lease_deadline_ms")  # refreshed by _leases
            if old != row:
                self.runs[row["run_id"]] = row
                self.positions.setdefault(row["run_id"], "0-0")
                changed.append(row)
        gone = self._prune()
        changed = [r for r in changed if r["run_id"] in self.runs]
        if changed or gone:
            self._send({"type": "runs", "now_ms": _now(), "runs": changed, "gone": gone})
        return changed

    def _leases(self) -> list[str]:
        """Refresh lease time left of the live runs (one PTTL each); returns the runs whose lease came,
        went or moved by over LEASE_MOVED_MS (a renewal), so a steady countdown costs no message."""
        live = [r for r, row in self.runs.items() if row["state"] in ("queued", "running")]
        left = overview.lease_left_ms(live)
        now, moved = _now(), []
        for run_id in live:
            row = self.runs[run_id]
            deadline = now + left[run_id] if run_id in left else None
            prior = row.get("lease_deadline_ms")
            if (deadline is None) != (prior is None) or (deadline and prior and abs(deadline - prior) > LEASE_MOVED_MS):
                row["lease_deadline_ms"] = deadline
                moved.append(run_id)
        return moved

    def _prune(self) -> list[str]:
        """Keep the newest MAX_LIVE live and RECENT_ENDED ended runs; returns the run ids let go (a row
        let go comes back only when it is written again)."""
        ended = sorted((r for r in self.runs.values() if r["state"] in TERMINAL_STATES),
                       key=lambda r: -r["updated_at_ms"])
        live = sorted((r for r in self.runs.values() if r["state"] not in TERMINAL_STATES),
                      key=lambda r: -r["updated_at_ms"])
        gone = [row["run_id"] for row in ended[RECENT_ENDED:] + live[MAX_LIVE:]]
        for run_id in gone:
            self.gone[run_id] = self.runs.pop(run_id)["updated_at_ms"]
            self.positions.pop(run_id, None)
        floor = self.since_ms - 2 * OVERLAP_MS
        self.gone = {r: at for r, at in self.gone.items() if at >= floor}
        now = _now()
        for row in ended[:RECENT_ENDED]:  # an ended run's stream stops growing soon after its last write
            if now - row["updated_at_ms"] > 60_000:
                self.positions.pop(row["run_id"], None)
        return gone

    def _workers(self) -> list[dict[str, Any]]:
        return [asdict(p) for p in overview.processes()]

    def _routing(self) -> None:
        """The registry's workers scored now: only the workers whose score, factors or fields changed (and
        the ones gone) are pushed; then the queue watch and the routing feed's new entries."""
        new = view.snapshot()
        old = {w["name"]: w for w in self.routing.get("workers", [])}
        names = {w["name"] for w in new["workers"]}
        changed = [w for w in new["workers"] if old.get(w["name"]) != w]
        gone = [n for n in old if n not in names]
        head = {k: v for k, v in new.items() if k not in ("workers", "at_ms")}
        if changed or gone or head != {k: v for k, v in self.routing.items() if k not in ("workers", "at_ms")}:
            self._send({"type": "routing", "now_ms": _now(), **head, "order": [w["name"] for w in new["workers"]],
                        "workers": changed, "gone": gone})
        self.routing = new
        states = self._queues()
        if states != self.queues:
            self.queues = states
            self._send({"type": "queues", "now_ms": _now(), "queues": states})
        entries = registry.feed_after(self.feed_pos)
        if entries:
            self.feed_pos = entries[-1]["id"]
            out = [routing_event(e) for e in entries]
            self.feed.extend(out)
            self._send({"type": "events", "events": out})

    def _queues(self) -> list[dict[str, Any]]:
        """The queue watch from this process (a crossing raises or clears its warning on the routing feed)."""
        states, _raised, _cleared = queue_watch.watch(queues.ALL)
        return [asdict(st) for st in states]

    def _dead_letters(self) -> list[dict[str, Any]]:
        return [{"run_id": d.run_id, "step": d.step, "reason": d.reason, "attempts": len(d.attempts),
                 "at_ms": d.at_ms, "replays": d.replays} for d in service.dead_letters(limit=50)]

    def _counters(self) -> dict[str, Any]:
        """Runs per state (one GROUP BY on the state index), dead letters now, fast takeover's false
        positives, and what this hub has seen since it started."""
        with transaction(readonly=True) as conn:
            by_state = {s: 0 for s in RUN_STATES}
            by_state.update({s: int(n) for s, n in conn.execute(
                sa.select(_RC.state, sa.func.count()).group_by(_RC.state))})
        return {"runs_by_state": by_state, "dead_letters": len(self.dead_letters),
                "false_positive_deaths": overview.false_positives(),
                "events_seen": self.seen["events"], "takeovers_seen": self.seen["takeovers"]}


def _order(event: dict[str, Any]) -> tuple[int, int]:
    """Stream ids in time order (as numbers: "...-10" comes after "...-9")."""
    ms, _, seq = event["stream_id"].partition("-")
    return int(ms or 0), int(seq or 0)


def _now() -> int:
    return int(time.time() * 1000)


HUB = Hub()
