"""The live event stream (GET /api/runs/{id}/events): real uvicorn processes, real Redis, MariaDB and workers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from checkpoints import api_keys
from fenced_api.live import check_after
from fenced_api.live_hub import Fold, Item, items_of
from fencing import events, faults
from tasks import submit_run
from tests.workers_fixture import wait_for, wait_terminal

ROOT = Path(__file__).resolve().parents[1]


# -- a client's view: what a UI does with the messages ------------------------------------------------
class View:
    """Applies messages as a UI would: a snapshot replaces the view, an event is appended, superseded
    eids are folded away. Records any eid shown twice and any fold of an eid not shown."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.last_id = "0"
        self.problems: list[str] = []
        self.ids_seen: list[str] = []

    def apply(self, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if kind == "snapshot":
            self.events = list(msg["events"])
            self.last_id = msg["last_id"]
            return
        if kind in ("reconnected", "pong"):
            return
        folded = msg.get("superseded", []) if kind == "event" else msg["eids"]
        for eid in folded:
            if not any(e["eid"] == eid for e in self.events):
                self.problems.append(f"folded {eid} which is not shown")
            self.events = [e for e in self.events if e["eid"] != eid]
        if kind == "event":
            e = msg["event"]
            if any(x["eid"] == e["eid"] for x in self.events):
                self.problems.append(f"eid {e['eid']} shown twice")
            self.events.append(e)
            self.ids_seen.append(e["id"])
            self.last_id = e["id"]
        else:
            self.last_id = msg["id"]

    def pairs(self) -> list[tuple[str, str]]:
        return [(e["id"], e["eid"]) for e in self.events]


def live_pairs(run_id: str) -> list[tuple[str, str]]:
    return [(e.stream_id, e.eid) for e in events.live_view(events.read(run_id))]


# -- pure: the incremental fold is live_view, from any cut point ---------------------------------------
def _stream(spec: list[tuple[int, int]]) -> list[events.Event]:
    """A synthetic stream: (kind, n) entries; kind 0 = an event with eid e<n>, 1 = a task_resumed that
    covers up to the entry n back."""
    out: list[events.Event] = []
    for i, (kind, n) in enumerate(spec):
        sid = f"{1000 + i}-0"
        if kind == 1:
            covered = out[-1 - n % len(out)].stream_id if out and n % (len(out) + 1) else ""
            out.append(events.Event(f"resume:{i}", "task_resumed", 0, i, {"last_event_id": covered}, sid))
        else:
            out.append(events.Event(f"e{n}", "step_done", 0, 1, {}, sid))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 6)), max_size=25), st.integers(0, 30))
def test_fold_from_any_cut_equals_live_view(spec: list[tuple[int, int]], cut: int) -> None:
    stream = _stream(spec)
    items = items_of(stream)
    cut = min(cut, len(stream))
    # The first connection: a snapshot at `cut`; then every later entry as a message.
    fold = Fold()
    for item in items[:cut]:
        fold.step(item)
    view = View()
    view.apply({"type": "snapshot", "last_id": fold.last, "events": [
        {"id": e.stream_id, "eid": e.eid} for e in fold.view(stream[:cut])]})
    for item in items[cut:]:
        msg = fold.step(item)
        if msg is not None:
            view.apply(msg)
    assert view.pairs() == [(e.stream_id, e.eid) for e in events.live_view(stream)]
    assert not view.problems


def test_fold_marks_the_superseded_half_step() -> None:
    stream = [events.Event("s0:decision", "decision", 0, 1, {}, "1-0"),
              events.Event("s0:done", "step_done", 0, 1, {}, "2-0"),
              events.Event("s1:decision", "decision", 1, 1, {}, "3-0"),
              events.Event("resume:2", "task_resumed", 1, 2, {"last_event_id": "2-0"}, "4-0"),
              events.Event("s1:decision", "decision", 1, 2, {}, "5-0")]
    fold = Fold()
    msgs = [fold.step(i) for i in items_of(stream)]
    assert msgs[3] is not None and msgs[3]["superseded"] == ["s1:decision"]
    assert msgs[4] is not None and msgs[4]["event"]["id"] == "5-0", "the replayed decision is shown again"
    assert [e.stream_id for e in fold.view(stream)] == ["1-0", "2-0", "4-0", "5-0"]
    # Without the mark the replayed decision would be a duplicate eid and not be sent.
    assert Fold().step(Item(stream[0])) is not None


def test_after_is_validated_naming_the_field() -> None:
    assert check_after("1700000000000-3") == "1700000000000-3"
    assert check_after(None) is None and check_after("") is None
    with pytest.raises(Exception, match="after: must be a stream id"):
        check_after("1-0; DROP")


# -- real servers ---------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Api:
    """One `uvicorn fenced_api.app:create_app --factory` process."""

    def __init__(self, tmp: Path, name: str, **env: str) -> None:
        self.port = _free_port()
        self.log = tmp / f"api-{name}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "fenced_api.app:create_app", "--factory", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning"],
            cwd=ROOT, env={**os.environ, **env}, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        raise AssertionError(f"API did not start: {self.log.read_text()[-2000:]}")

    def ws(self, run_id: str, key: str, after: str | None = None) -> str:
        query = f"?key={key}" + (f"&after={after}" if after else "")
        return f"ws://127.0.0.1:{self.port}/api/runs/{run_id}/events{query}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def apis(tmp_path: Path, mysql_store: str) -> Iterator[Any]:
    started: list[Api] = []

    def start(name: str = "a", **env: str) -> Api:
        api = Api(tmp_path, name, **env)
        started.append(api)
        return api

    yield start
    for api in started:
        api.stop()


async def _watch(url: str, limit: int | None = None, timeout: float = 60,
                 opened: asyncio.Event | None = None) -> tuple[list[dict[str, Any]], int | None]:
    """Messages until the server closes (its close code), or `limit` messages (code None: we left).
    `opened` is set once the first message (the snapshot) has arrived."""
    msgs: list[dict[str, Any]] = []
    async with connect(url, ping_interval=None) as ws:

        async def pinger() -> None:
            while True:
                await asyncio.sleep(0.5)
                await ws.send('{"type":"ping"}')

        task = asyncio.ensure_future(pinger())
        try:
            async with asyncio.timeout(timeout):
                while limit is None or len(msgs) < limit:
                    msgs.append(json.loads(await ws.recv()))
                    if opened is not None:
                        opened.set()
        except ConnectionClosed as exc:
            return msgs, exc.rcvd.code if exc.rcvd else None
        except TimeoutError:
            return msgs, None  # still connected when `timeout` ran out
        finally:
            task.cancel()
    return msgs, None


def watch(url: str, limit: int | None = None, timeout: float = 60) -> tuple[list[dict[str, Any]], int | None]:
    return asyncio.run(_watch(url, limit, timeout))


def _fold(*message_lists: list[dict[str, Any]]) -> View:
    view = View()
    for msgs in message_lists:
        for m in msgs:
            if m["type"] != "pong":
                view.apply(m)
    return view


def test_refusals_are_http_answers(apis):
    api = apis()
    mine, theirs = api_keys.issue("alice"), api_keys.issue("bob")
    run_id = submit_run("alice", "buy headphones")
    for url, status in [(api.ws(run_id, theirs), 404), (api.ws("no-such-run", mine), 404),
                        (api.ws(run_id, mine, after="x'1"), 400)]:
        with pytest.raises(InvalidStatus) as err:
            watch(url, limit=1, timeout=10)
        assert err.value.response.status_code == status, url
    with pytest.raises((InvalidStatus, ConnectionClosed)):
        watch(api.ws(run_id, "fk_not_a_key"), limit=1, timeout=10)
    r = httpx.get(f"{api.http}/api/runs/{run_id}/events/sse", headers={"Authorization": f"Bearer {theirs}"})
    assert r.status_code == 404, r.text
    # The owner's snapshot of a queued run: its state, and the one event a submit writes.
    [snap], _code = watch(api.ws(run_id, mine), limit=1, timeout=10)
    assert snap["type"] == "snapshot" and snap["run"]["state"] == "queued", snap
    assert [e["eid"] for e in snap["events"]] == ["run:queued"] and snap["last_id"] == snap["events"][0]["id"]


def test_silent_client_is_dropped_and_a_pinging_one_is_not(apis):
    api = apis(FENCED_LIVE_SILENT_S="1")
    key = api_keys.issue("alice")
    run_id = submit_run("alice", "buy headphones")

    async def silent() -> tuple[int | None, float]:
        started = time.monotonic()
        async with connect(api.ws(run_id, key), ping_interval=None) as ws:
            try:
                async with asyncio.timeout(10):
                    while True:
                        await ws.recv()
            except ConnectionClosed as exc:
                return (exc.rcvd.code if exc.rcvd else None), time.monotonic() - started
            except TimeoutError:
                return None, time.monotonic() - started

    code, after_s = asyncio.run(silent())
    assert code == 4408 and 0.9 < after_s < 5, (code, after_s)
    msgs, code = watch(api.ws(run_id, key), timeout=3)  # pings every 0.5 s for 3 s: kept
    assert code is None and msgs[0]["type"] == "snapshot" and {"type": "pong"} in msgs


class RawClient:
    """A WebSocket client on a bare socket that reads nothing until told to: a client that cannot keep
    up (client libraries read into their own memory, which would hide the backlog from the server)."""

    def __init__(self, port: int, path: str) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16_384)  # fixed small: no autotuning
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head

    def read_to_close(self, timeout: float) -> tuple[int | None, int]:
        """Read everything until the server's close frame: (its code, text messages before it)."""
        self.sock.settimeout(timeout)
        buf, texts = b"", 0
        while True:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                return None, texts
            buf += chunk
            while len(buf) >= 2:
                opcode, n, at = buf[0] & 0x0F, buf[1] & 0x7F, 2
                if n == 126:
                    n, at = int.from_bytes(buf[2:4], "big"), 4
                elif n == 127:
                    n, at = int.from_bytes(buf[2:10], "big"), 10
                if len(buf) < at + n:
                    break
                payload, buf = buf[at:at + n], buf[at + n:]
                if opcode == 0x8:
                    return int.from_bytes(payload[:2], "big"), texts
                texts += opcode == 0x1


def test_slow_consumer_is_dropped_with_a_close_code(apis):
    api = apis(FENCED_LIVE_QUEUE_BYTES=str(256 * 1024), FENCED_LIVE_CLOSE_WAIT_S="60")
    key = api_keys.issue("alice")
    run_id = submit_run("alice", "buy headphones")
    blob = "x" * 8_000
    sent = 0

    async def scenario() -> tuple[int | None, int, int]:
        nonlocal sent
        slow = RawClient(api.port, f"/api/runs/{run_id}/events?key={key}")
        async with connect(api.ws(run_id, key), ping_interval=None) as fast:
            got_fast = 0

            async def keep_up() -> None:
                nonlocal got_fast
                while True:
                    got_fast += json.loads(await fast.recv())["type"] == "event"

            reader = asyncio.ensure_future(keep_up())
            # ~16 MB in bursts of 32 KB (an eighth of the queue bound: a client that reads keeps up), while
            # `slow` reads nothing: the kernel's buffers fill, then its queue on the server.
            for i in range(500):
                await asyncio.to_thread(events.append_many, run_id, 1,
                                        [(f"big:{sent + j}", "note", 0, {"blob": blob}) for j in range(4)])
                sent += 4
                await asyncio.sleep(0.002)
                if i % 100 == 0:
                    await fast.send('{"type":"ping"}')
            await asyncio.sleep(1)
            reader.cancel()
        code, got_slow = await asyncio.to_thread(slow.read_to_close, 30)
        return code, got_slow, got_fast

    code, got_slow, got_fast = asyncio.run(scenario())
    assert code == 4429, (code, got_slow)
    assert got_slow < sent, "the slow client was dropped before it was sent everything"
    assert got_fast >= sent, f"a client that keeps up gets every event ({got_fast} of {sent})"


# -- with real workers ----------------------------------------------------------------------------------
def _sse(url: str, headers: dict[str, str], timeout: float = 30) -> list[dict[str, Any]]:
    """Every SSE message until the server ends the response: {"event", "id", "data"}."""
    out: list[dict[str, Any]] = []
    block: dict[str, Any] = {}
    with httpx.stream("GET", url, headers=headers, timeout=timeout) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.status_code
        for line in r.iter_lines():
            if not line:
                if "data" in block:
                    out.append({**block, "data": json.loads(block["data"])})
                block = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                block[name] = value
    return out


def test_the_stream_is_the_live_view_and_ends_after_the_final_event(workers, apis):
    api = apis()
    key = api_keys.issue("alice")
    run_id = submit_run("alice", "buy headphones")

    async def go() -> tuple[list[dict[str, Any]], int | None]:
        task = asyncio.ensure_future(_watch(api.ws(run_id, key), timeout=60))
        await asyncio.sleep(0.5)
        await asyncio.to_thread(workers.start, "w1")
        return await task

    msgs, code = asyncio.run(go())
    assert code == 1000, (code, msgs[-3:])
    assert msgs[0]["type"] == "snapshot" and msgs[0]["run"]["state"] == "queued"
    view = _fold(msgs)
    assert not view.problems, view.problems
    assert view.pairs() == live_pairs(run_id), "the stream folds into the run's live view"
    assert len(view.ids_seen) == len(set(view.ids_seen)), "no stored event sent twice"
    assert view.events[-1]["type"] == "run_done"
    [run] = wait_terminal([run_id], timeout=10)
    assert run.state == "done"


@pytest.mark.parametrize("connect_at", ["before_the_run", "after_the_tools"])
def test_a_takeover_shows_live_with_the_lost_half_step_folded(workers, apis, connect_at):
    """The client is shown the dead holder's tool events either live (it connected before the run
    started) or in its opening snapshot (it connected after the tools ran); either way the takeover's
    fold names only events the client was shown."""
    api = apis()
    key = api_keys.issue("alice")
    faults.arm("after_tools")  # the first step's holder stops after its tools, before checkpoint B
    run_id = submit_run("alice", "buy running shoes")
    killed: list[float] = []

    async def go() -> tuple[list[dict[str, Any]], int | None]:
        opened = asyncio.Event()
        task: asyncio.Future[tuple[list[dict[str, Any]], int | None]] | None = None
        if connect_at == "before_the_run":  # the snapshot is taken while the run is still queued
            task = asyncio.ensure_future(_watch(api.ws(run_id, key), timeout=90, opened=opened))
            await asyncio.wait_for(opened.wait(), 20)
        await asyncio.to_thread(workers.start, "a")
        await asyncio.to_thread(workers.start, "b")
        hit = await asyncio.to_thread(faults.next_hit, 30)
        assert hit and hit[1] == run_id, hit
        if task is None:  # the holder is stopped after its tools: they are in the snapshot
            task = asyncio.ensure_future(_watch(api.ws(run_id, key), timeout=90, opened=opened))
            await asyncio.wait_for(opened.wait(), 20)
        await asyncio.sleep(0.3)  # the events before the stop reach the client
        killed.append(time.time() * 1000)
        workers.by_pid(hit[2]).kill(signal.SIGKILL)
        return await task

    msgs, code = asyncio.run(go())
    assert code == 1000, (code, msgs[-3:])
    assert msgs[0]["type"] == "snapshot", msgs[0]
    resumed = [m for m in msgs if m["type"] == "event" and m["event"]["type"] == "task_resumed"]
    assert len(resumed) == 1, "the takeover arrives live, once"
    assert int(resumed[0]["event"]["id"].split("-")[0]) > killed[0], "appended after the SIGKILL"
    in_snapshot = [e["eid"] for e in msgs[0]["events"]]
    live = [m["event"]["eid"] for m in msgs[:msgs.index(resumed[0])] if m["type"] == "event"]
    superseded = set(resumed[0]["superseded"])
    assert superseded, "the lost half-step (the dead holder's tool events) is marked"
    assert superseded <= set(in_snapshot + live), "only what the client was shown is folded"
    if connect_at == "after_the_tools":
        assert superseded <= set(in_snapshot), ("the dead holder's tool events were in the snapshot",
                                                in_snapshot)
    else:
        assert in_snapshot == ["run:queued"] and superseded <= set(live), in_snapshot
    view = _fold(msgs)
    assert not view.problems, view.problems
    assert view.pairs() == live_pairs(run_id)
    assert [e for e in events.read(run_id) if e.type == "task_resumed"], "the run really was taken over"


def test_a_client_reconnecting_to_another_replica_gets_what_it_missed_once(workers, apis):
    a, b = apis("a"), apis("b")
    key = api_keys.issue("alice")
    workers.start("w1", FENCED_STUB_STEP_MS="400")
    run_id = submit_run("alice", "buy a keyboard")
    wait_for(lambda: len(events.read(run_id)) >= 3, 30, "the run to be under way")
    first, code = watch(a.ws(run_id, key), limit=3)
    assert code is None and first[0]["type"] == "snapshot"
    left = _fold(first)
    time.sleep(1.5)  # the run moves on while the client is away
    second, code = watch(b.ws(run_id, key, after=left.last_id), timeout=60)
    assert code == 1000, (code, second[-3:])
    assert second[0] == {"type": "reconnected", "after": left.last_id, "run": second[0]["run"]}
    missed = [m for m in second if m["type"] == "event"]
    assert missed, "events were appended while the client was away"
    view = _fold(first, second)
    assert not view.problems, view.problems
    assert view.pairs() == live_pairs(run_id)
    assert len(view.ids_seen) == len(set(view.ids_seen)), "none twice across the two connections"
    # The same resume over SSE (Last-Event-ID, as EventSource sends it): the same events, then the end.
    sse = _sse(f"{b.http}/api/runs/{run_id}/events/sse",
               {"Authorization": f"Bearer {key}", "Last-Event-ID": left.last_id})
    assert next(m["event"] for m in sse) == "reconnected"
    assert [m["id"] for m in sse if m["event"] == "event"] == [m["event"]["id"] for m in missed]
