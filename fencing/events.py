"""A run's live event stream: appended through the fenced Lua script, read by clients that merge by id."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import structlog

from fenced_core import jsonbytes
from fenced_core.errors import FencedOut
from fenced_core.settings import get_settings
from fencing import group_commit, keys, scripts
from fencing.cluster import is_cluster
from fencing.connection import client_for, get_redis
from fencing.scripts import scripts_for

log = structlog.get_logger("fencing.events")

# A run's last event by how it ended: (event id, type). The id is fixed, so a repaired one merges.
# Every terminal state has one (an expired run is `failed` with error_class "expired").
FINAL_EVENTS = {"done": ("run:done", "run_done"), "failed": ("run:failed", "run_failed"),
                "dead": ("run:dead", "run_dead"), "cancelled": ("run:cancelled", "run_cancelled")}


@dataclass(frozen=True)
class Event:
    """One entry: `eid` is stable across replays (a replayed tool reuses its tool-call id)."""

    eid: str
    type: str
    step: int
    epoch: int
    data: dict[str, Any]
    stream_id: str = ""

    def fields(self) -> list[str]:
        return ["eid", self.eid, "type", self.type, "step", str(self.step), "epoch", str(self.epoch),
                "data", jsonbytes.dumps(self.data).decode()]


def append(run_id: str, epoch: int, eid: str, type_: str, step: int, data: dict[str, Any] | None = None,
           client: redis.Redis | None = None, raise_mirror: bool = False) -> str:
    """Append one event as holder `epoch`; raises FencedOut if a newer epoch owns the run."""
    return append_many(run_id, epoch, [(eid, type_, step, data or {})], client=client,
                       raise_mirror=raise_mirror)[-1]


def append_many(run_id: str, epoch: int, items: list[tuple[str, str, int, dict[str, Any]]],
                client: redis.Redis | None = None, raise_mirror: bool = False) -> list[str]:
    """Append several events in one round trip; all or the first refused raises FencedOut.

    With `raise_mirror`, the epoch mirror is raised first in the same round trip (a fresh claim's
    first write to Redis): a mirror already above `epoch` raises FencedOut and nothing is appended."""
    return Appends(run_id, epoch, items, raise_mirror).send(client)


@dataclass
class Appends:
    """Event appends as script calls, sent in a round trip of their own (`send`) or riding at the head of
    another (a lease renewal: fencing.lease.Lease.renew); `settle` reads their replies (FencedOut for a
    refused one) and records that they went out (`ids`)."""

    run_id: str
    epoch: int
    items: list[tuple[str, str, int, dict[str, Any]]]
    raise_mirror: bool = False
    ids: list[str] | None = None  # the stream ids, once settled
    # A round trip carrying them was sent and gave no reply (it failed): they may have landed.
    unsettled: bool = False
    # The riders `send` was given ran (with the appends, or alone before them).
    riders_ran: bool = False

    def calls(self) -> list[scripts.Call]:
        maxlen = get_settings().events_keep
        mirror = [scripts.raise_epoch(self.run_id, epoch=self.epoch)] if self.raise_mirror else []
        return mirror + [scripts.append_event(self.run_id, epoch=self.epoch, maxlen=maxlen,
                                              fields=Event(eid, type_, step, self.epoch, data).fields())
                         for eid, type_, step, data in self.items]

    def send(self, client: redis.Redis | None = None,
             riders: Sequence[scripts.Call | scripts.Command] = ()) -> list[str]:
        """Append them in a round trip of their own, or shared with other runs' appends in flight from
        this process at the same moment (fencing.group_commit); their stream ids.

        `riders`: other script calls (or plain commands) that go in the same round trip, ahead of the
        appends (a run's final event carries its slot release and its lease release: tasks.endings); an
        error among their replies raises as the appends' would. On a Redis Cluster, whose pipelines order
        nothing across nodes, they go first in a round trip of their own, so they still come before the
        appends; there they live on other nodes than the stream, and a failure of theirs is logged and
        never holds the appends back. `riders_ran` says afterwards whether they ran.

        If a round trip that carried them failed (`unsettled`: a lost reply, or a Redis Cluster pipeline
        whose other node failed after theirs ran), the stream is looked at first: when its newest entries
        are these events under this epoch, they landed, and their ids are taken instead of appending
        them twice (a run's appends are sequential, so nothing of this holder can follow them)."""
        client = client or get_redis()
        if riders and (is_cluster(client) or self.unsettled):
            self.riders_ran = _send_alone(client, riders)
            riders = ()
        if self.unsettled and self._landed(client):
            return self.ids  # type: ignore[return-value]
        calls: list[scripts.Call | scripts.Command] = list(self.calls())
        at = 1 if self.raise_mirror else 0  # riders after the epoch mirror's raise, ahead of the appends
        calls[at:at] = riders
        replies = group_commit.send(client, calls)
        self.riders_ran = self.riders_ran or bool(riders)
        del replies[at:at + len(riders)]  # settle reads the mirror's reply and the appends' only
        return self.settle(replies)

    def _landed(self, client: redis.Redis) -> bool:
        newest: list[tuple[str, dict[str, str]]] = client.xrevrange(  # type: ignore[assignment]
            keys.events(self.run_id), count=len(self.items))
        newest.reverse()
        if [(f.get("eid"), f.get("epoch")) for _id, f in newest] != [(eid, str(self.epoch))
                                                                     for eid, *_rest in self.items]:
            return False
        self.ids = [stream_id for stream_id, _f in newest]
        return True

    def settle(self, replies: list[Any]) -> list[str]:
        replies = list(replies)
        if self.raise_mirror and int(replies.pop(0)) > self.epoch:
            raise FencedOut(self.run_id, self.epoch, "epoch mirror")
        if any(i is None for i in replies):
            raise FencedOut(self.run_id, self.epoch, f"event {self.items[replies.index(None)][0]}")
        self.ids = [str(i) for i in replies]
        return self.ids


def _send_alone(client: redis.Redis, riders: Sequence[scripts.Call | scripts.Command]) -> bool:
    """Riders that cannot share the appends' round trip (a cluster; an unsettled retry) go first, alone,
    best effort: follow-ups the appends must not fail with (a slot release that the sweeper's reconcile
    redoes, the repair of an ended run gives it back too; a lease release that the delivery makes again
    when this one failed). Whether they ran."""
    try:
        scripts_for(client).execute_all(client, riders)
    except redis.RedisError as exc:
        log.warning("riders_failed", error=repr(exc),
                    scripts=[r.script if isinstance(r, scripts.Call) else r.name for r in riders])
        return False
    return True


def append_first_of_many(items: list[tuple[str, Event]], client: redis.Redis | None = None) -> None:
    """Append one epoch-0 event to each of several runs' streams in one round trip (a batch submit's
    `run_queued`). A run a worker claimed already refuses its append (the mirror is higher): skipped."""
    client = client or get_redis()
    registered = scripts_for(client)
    maxlen = get_settings().events_keep

    def build(pipe: object) -> None:
        for run_id, ev in items:
            registered.queue(pipe, scripts.append_event(run_id, epoch=0, maxlen=maxlen,  # type: ignore[arg-type]
                                                        fields=ev.fields()))

    registered.execute(client, build)


def newest_eid(run_id: str, client: redis.Redis | None = None) -> str | None:
    """The `eid` of the run's newest event, or None if its stream is empty (or Redis lost it)."""
    newest: list[tuple[str, dict[str, str]]] = (client or get_redis()).xrevrange(  # type: ignore[assignment]
        keys.events(run_id), count=1)
    return newest[0][1].get("eid") if newest else None


def append_final(run_id: str, epoch: int, state: str, step: int, data: dict[str, Any], *,
                 unless_present: bool = False, raise_mirror: bool = False,
                 client: redis.Redis | None = None) -> str | None:
    """End the run's stream with the final event of terminal `state` (its fixed id, FINAL_EVENTS), as
    holder `epoch`; raises FencedOut if a newer epoch owns the run. With `unless_present`, nothing is
    appended (None returned) when the newest event already is that final event: a repair or a repeated
    cancel adds no second copy. Clients merge by id, so a copy that does land shows once."""
    eid, type_ = FINAL_EVENTS[state]
    if unless_present and newest_eid(run_id, client) == eid:
        return None
    return append(run_id, epoch, eid, type_, step, data, client=client, raise_mirror=raise_mirror)


def read(run_id: str, after: str = "-", client: redis.Redis | None = None) -> list[Event]:
    """Every event of a run after stream id `after` (exclusive), oldest first."""
    client = client or get_redis()
    start = "-" if after in ("", "-") else f"({after}"
    out = []
    entries: list[tuple[str, dict[str, str]]] = client.xrange(keys.events(run_id), min=start)  # type: ignore[assignment]
    for stream_id, f in entries:
        out.append(Event(f["eid"], f["type"], int(f["step"]), int(f["epoch"]), json.loads(f["data"]), stream_id))
    return out


def live_view(events: list[Event]) -> list[Event]:
    """What a client shows: superseded half steps dropped, then merged by `eid` (first wins).

    A `task_resumed` event names the last event id its checkpoint covered; events after that id and
    before the resume came from work the crash threw away and are superseded.
    """
    superseded: set[str] = set()
    for i, ev in enumerate(events):
        if ev.type == "task_resumed":
            covered = ev.data.get("last_event_id") or ""
            for prior in events[:i]:
                if prior.type != "task_resumed" and _after(prior.stream_id, covered):
                    superseded.add(prior.stream_id)
    seen: set[str] = set()
    view = []
    for ev in events:
        if ev.stream_id in superseded or ev.eid in seen:
            continue
        seen.add(ev.eid)
        view.append(ev)
    return view


def _after(stream_id: str, covered: str) -> bool:
    if not covered:
        return True
    a, b = (tuple(int(x) for x in s.split("-")) for s in (stream_id, covered))
    return a > b


# -- following streams live (the API's event stream) --------------------------------------------------
FINAL_TYPES = frozenset(type_ for _eid, type_ in FINAL_EVENTS.values())


def id_key(stream_id: str) -> tuple[int, int]:
    """A stream id as a sortable (ms, seq) pair; "0", "" and "-" are the beginning of a stream. Pure."""
    if stream_id in ("", "-", "0"):
        return (0, 0)
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def _parse(stream_id: str, f: dict[str, str]) -> Event:
    return Event(f["eid"], f["type"], int(f["step"]), int(f["epoch"]), json.loads(f["data"]), stream_id)


def superseded_by(resume: Event, prior: list[Event]) -> set[str]:
    """The stream ids of `prior` (events stored before the task_resumed `resume`) that it supersedes:
    every non-resume event after the id its checkpoint covered (live_view's rule, for one resume): the
    half-step a crash threw away, which the new holder replays under the same eids. Pure."""
    covered = resume.data.get("last_event_id") or ""
    return {e.stream_id for e in prior if e.type != "task_resumed" and _after(e.stream_id, covered)}


def read_between(run_id: str, after: str, before: str, client: redis.Redis | None = None) -> list[Event]:
    """The run's events with stream ids strictly between `after` ("" = the beginning) and `before`.
    Reads only (safe to repeat, during a takeover or after a crash of anyone)."""
    client = client or get_redis()
    start = "-" if after in ("", "-", "0") else f"({after}"
    entries: list[tuple[str, dict[str, str]]] = client.xrange(  # type: ignore[assignment]
        keys.events(run_id), min=start, max=f"({before}")
    return [_parse(sid, f) for sid, f in entries]


# On a Redis Cluster one XREAD cannot name streams of different slots (every run has its own hash tag),
# so a wait over many runs is a poll: one non-blocking XREAD per stream, pipelined (one round trip per
# node, in parallel), every CLUSTER_POLL_MS until something came or the wait ends.
CLUSTER_POLL_MS = 100


def read_streams(client: redis.Redis, streams: dict[str, str], block_ms: int, count: int | None = None,
                 woken: threading.Event | None = None) -> list[tuple[str, list[tuple[str, dict[str, str]]]]]:
    """XREAD over `streams` (key -> exclusive stream id), waiting up to `block_ms` for the first entry:
    one blocking XREAD on one Redis; on a Redis Cluster a poll of per-stream XREADs (see CLUSTER_POLL_MS)
    that `woken` (set by another thread) ends early. Returns XREAD's reply: [(key, entries)], [] if none."""
    if not streams:
        return []
    if not is_cluster(client):
        found: Any = client.xread(streams, count=count, block=block_ms)  # type: ignore[arg-type]
        return list(found or [])
    deadline = time.monotonic() + block_ms / 1000
    names = list(streams)
    while True:
        pipe = client.pipeline(transaction=False)
        for key in names:
            pipe.xread({key: streams[key]}, count=count)
        out = [(key, entries) for key, reply in zip(names, pipe.execute(), strict=True)
               for _key, entries in (reply or [])]
        left = deadline - time.monotonic()
        if out or left <= 0 or (woken is not None and woken.is_set()):
            return out
        if woken is not None:
            woken.wait(min(left, CLUSTER_POLL_MS / 1000))
        else:
            time.sleep(min(left, CLUSTER_POLL_MS / 1000))


class StreamWaiter:
    """Waits on many runs' event streams at once (one XREAD BLOCK) on a Redis connection of its own.

    Only reads: a crash or a takeover of a run changes nothing here (a resumed run's events simply
    follow in its stream, with the task_resumed that supersedes the lost half-step). `wake()`, from any
    thread, ends a wait early (CLIENT UNBLOCK), so a new run to watch is included at once. On a Redis
    Cluster one XREAD cannot span slots: the wait is a poll (`read_streams`), and `wake()` ends it at its
    next poll."""

    def __init__(self, url: str | None = None, max_block_ms: int = 5_000) -> None:
        self.max_block_ms = max_block_ms
        self.client = client_for(url or get_settings().redis_url, single_connection_client=True,
                                 socket_timeout=max_block_ms / 1000 + 5)
        self._id: int | None = None
        self._woken = threading.Event() if is_cluster(self.client) else None

    def read(self, positions: dict[str, str], block_ms: int) -> dict[str, list[Event]]:
        """Events appended to each run's stream after its position (a stream id; "0" = all), waiting up
        to `block_ms` for the first; {} when none came (or the wait was woken)."""
        streams = {keys.events(run_id): pos or "0" for run_id, pos in positions.items()}
        by_key = {keys.events(run_id): run_id for run_id in positions}
        if self._woken is not None:
            got = read_streams(self.client, streams, min(block_ms, self.max_block_ms), woken=self._woken)
            self._woken.clear()
        else:
            if self._id is None:
                self._id = int(self.client.client_id())
            got = self.client.xread(  # type: ignore[assignment]
                streams, block=min(block_ms, self.max_block_ms)) or []  # type: ignore[arg-type]
        out: dict[str, list[Event]] = {}
        for key, entries in got:
            out[by_key[key]] = [_parse(sid, f) for sid, f in entries]
        return out

    def wake(self, client: redis.Redis | None = None) -> None:
        """End the current wait now (it returns {}); a no-op when not waiting."""
        if self._woken is not None:
            self._woken.set()
        elif self._id is not None:
            (client or get_redis()).client_unblock(self._id)

    def close(self) -> None:
        """Close the waiter's connection."""
        self.client.close()
