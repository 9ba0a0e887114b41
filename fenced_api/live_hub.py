"""The live stream's machinery: one Redis wait per process fans new events out to bounded client outboxes.

Nothing here is durable: a connection's state is a function of the run's stream up to the last id it
was sent (`Fold`), so a client that reconnects with that id to any replica continues exactly where it
was (every missed event once, none twice), whatever crashed or took over in between.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import structlog

from fencing import events as ev

log = structlog.get_logger("fenced_api.live")


def event_json(e: ev.Event) -> dict[str, Any]:
    """An event as clients receive it; `id` is its stream id (what a reconnect passes back, to any
    replica, after any crash: stream ids never change)."""
    return {"id": e.stream_id, "eid": e.eid, "type": e.type, "step": e.step, "epoch": e.epoch, "data": e.data}


def to_json(msg: dict[str, Any]) -> str:
    """A message as WebSocket text."""
    return json.dumps(msg, default=str)


@dataclass(frozen=True)
class Item:
    """A stored event as the hub read it; for a task_resumed (a takeover), the stream ids it supersedes."""

    event: ev.Event
    superseded: frozenset[str] = frozenset()
    # The framed text of its plain `event` message, per framing: computed once for all subscribers.
    texts: dict[Callable[[dict[str, Any]], str], str] = field(default_factory=dict, compare=False, repr=False)


def items_of(stream: list[ev.Event]) -> list[Item]:
    """The items of a stream read whole (each task_resumed with what it supersedes before it). Pure."""
    return [Item(e, frozenset(ev.superseded_by(e, stream[:i])) if e.type == "task_resumed" else frozenset())
            for i, e in enumerate(stream)]


@dataclass
class Fold:
    """A client's live view, advanced one stored event at a time: the incremental form of
    fencing.events.live_view. `shown` maps each shown eid to its stream id; an event whose eid is shown
    is not sent again; a task_resumed un-shows (and names, to fold) what it supersedes."""

    shown: dict[str, str] = field(default_factory=dict)
    last: str = "0"
    final_seen: bool = False

    def step(self, item: Item) -> dict[str, Any] | None:
        """The message `item` yields for the client (None: nothing new to show)."""
        e = item.event
        self.last = e.stream_id
        self.final_seen = self.final_seen or e.type in ev.FINAL_TYPES
        marks = []
        if e.type == "task_resumed":
            marks = [eid for eid, sid in self.shown.items() if sid in item.superseded]
            for eid in marks:
                del self.shown[eid]
        if e.eid in self.shown:
            return {"type": "superseded", "id": e.stream_id, "eids": marks} if marks else None
        self.shown[e.eid] = e.stream_id
        msg: dict[str, Any] = {"type": "event", "event": event_json(e)}
        if e.type == "task_resumed":
            msg["superseded"] = marks
        return msg

    def view(self, stream: list[ev.Event]) -> list[ev.Event]:
        """The shown events of `stream` (what the client displays), oldest first."""
        return [e for e in stream if self.shown.get(e.eid) == e.stream_id]


class Outbox:
    """A connection's send queue, bounded in bytes: a message that would exceed the bound (with others
    waiting) is refused and the outbox marked overflowed; the connection is then dropped, so a client
    that cannot keep up never grows the server's memory past `max_bytes` plus one message."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.queue: deque[str] = deque()
        self.bytes = 0
        self.overflowed = False
        self.ready = asyncio.Event()
        self.dropped = asyncio.Event()  # set once overflowed

    def put(self, text: str, force: bool = False) -> bool:
        """Queue one message; False (and overflowed) when it does not fit (`force`: the opening messages,
        which the stream's own cap bounds)."""
        if self.overflowed:
            return False
        if not force and self.queue and self.bytes + len(text) > self.max_bytes:
            self.overflowed = True
            self.queue.clear()
            self.bytes = 0
            self.ready.set()
            self.dropped.set()
            return False
        self.queue.append(text)
        self.bytes += len(text)
        self.ready.set()
        return True

    def pop(self) -> str:
        """The oldest queued message (the queue must not be empty)."""
        text = self.queue.popleft()
        self.bytes -= len(text)
        return text

    async def get(self) -> str | None:
        """The next message, waiting for one; None once overflowed."""
        while not self.queue and not self.overflowed:
            self.ready.clear()
            await self.ready.wait()
        if self.overflowed:
            return None
        text = self.queue.popleft()
        self.bytes -= len(text)
        return text


class Subscriber:
    """One connection's interest in one run: the hub hands it every item after `last`, on its loop, so a
    takeover's task_resumed and the replayed events after it reach it in stream order, each once."""

    def __init__(self, run_id: str, fold: Fold, outbox: Outbox,
                 frame: Callable[[dict[str, Any]], str] | None = None) -> None:
        self.run_id = run_id
        self.frame = frame or to_json
        self.fold = fold
        self.outbox = outbox
        self.last = fold.last  # the hub's cursor for this subscriber (hub thread only after subscribe)
        self.loop = asyncio.get_running_loop()
        self.ended = asyncio.Event()

    def feed(self, items: list[Item]) -> None:
        """On the loop: advance the fold, queue each message; the final event ends the subscription."""
        for item in items:
            if ev.id_key(item.event.stream_id) <= ev.id_key(self.fold.last) or self.ended.is_set():
                continue
            msg = self.fold.step(item)
            if msg is not None and not self.outbox.put(self._text(item, msg)):
                return
            if item.event.type in ev.FINAL_TYPES:
                self.end()

    def end(self) -> None:
        """The stream is over once what is queued is sent (wakes a sender waiting on the outbox)."""
        self.ended.set()
        self.outbox.ready.set()


    def _text(self, item: Item, msg: dict[str, Any]) -> str:
        if msg["type"] != "event" or "superseded" in msg:
            return self.frame(msg)  # depends on what this client was shown
        text = item.texts.get(self.frame)
        if text is None:
            text = item.texts[self.frame] = self.frame(msg)
        return text


class Hub:
    """One per process: a thread that waits on every watched run's stream at once (StreamWaiter) and
    hands new items to the subscribers of each run. A Redis outage pauses it (retried every
    `retry_s`); subscribers keep their positions and get what they missed when it is back."""

    def __init__(self, block_ms: int = 5_000, retry_s: float = 0.5) -> None:
        self.block_ms = block_ms
        self.retry_s = retry_s
        self.subs: dict[str, set[Subscriber]] = {}
        self.lock = threading.Lock()
        self.changed = threading.Event()
        self.waiter: ev.StreamWaiter | None = None
        self.thread: threading.Thread | None = None

    def subscribe(self, sub: Subscriber) -> None:
        """Watch `sub.run_id` from `sub.last` on; wakes the wait so the run is included at once."""
        with self.lock:
            self.subs.setdefault(sub.run_id, set()).add(sub)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="fenced-live-hub", daemon=True)
                self.thread.start()
        self.changed.set()
        if self.waiter is not None:
            try:
                self.waiter.wake()
            except redis.RedisError:
                pass  # the wait ends by itself within block_ms

    def unsubscribe(self, sub: Subscriber) -> None:
        """Stop handing `sub` anything (the connection ended)."""
        with self.lock:
            group = self.subs.get(sub.run_id)
            if group is not None:
                group.discard(sub)
                if not group:
                    del self.subs[sub.run_id]

    def watched(self) -> int:
        """How many connections are subscribed (across runs)."""
        with self.lock:
            return sum(len(g) for g in self.subs.values())

    def _positions(self) -> dict[str, str]:
        with self.lock:
            return {run_id: min((s.last for s in group), key=ev.id_key) for run_id, group in self.subs.items()}

    def _run(self) -> None:
        while True:
            self.changed.clear()
            positions = self._positions()
            if not positions:
                self.changed.wait(1.0)
                continue
            try:
                if self.waiter is None:
                    self.waiter = ev.StreamWaiter(max_block_ms=self.block_ms)
                got = self.waiter.read(positions, self.block_ms)
                for run_id, stored in got.items():
                    self._hand_out(run_id, self._items(run_id, stored))
            except redis.RedisError as exc:
                log.warning("live_hub_redis_error", error=str(exc))
                if self.waiter is not None:
                    self.waiter.close()
                    self.waiter = None
                self.changed.wait(self.retry_s)
            except Exception as exc:  # never let the one thread die: every stream would stop
                log.exception("live_hub_error", error=str(exc))
                self.changed.wait(self.retry_s)

    def _items(self, run_id: str, stored: list[ev.Event]) -> list[Item]:
        out = []
        for e in stored:
            superseded: frozenset[str] = frozenset()
            if e.type == "task_resumed":
                prior = ev.read_between(run_id, e.data.get("last_event_id") or "", e.stream_id)
                superseded = frozenset(ev.superseded_by(e, prior))
            out.append(Item(e, superseded))
        return out

    def _hand_out(self, run_id: str, items: list[Item]) -> None:
        with self.lock:
            group = list(self.subs.get(run_id, ()))
        for sub in group:
            new = [i for i in items if ev.id_key(i.event.stream_id) > ev.id_key(sub.last)]
            if new:
                sub.last = new[-1].event.stream_id
                sub.loop.call_soon_threadsafe(sub.feed, new)


_hub: Hub | None = None


def hub(block_ms: int) -> Hub:
    """This process's hub (created on first use; it dies with the process, and its clients reconnect)."""
    global _hub
    if _hub is None:
        _hub = Hub(block_ms)
    return _hub
