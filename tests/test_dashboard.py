"""The dashboard's server side without a browser: the overview socket (snapshot, then increments; admin
only), a run's page data scoped to its caller, the static files, and the watchdog's renew-failure count."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from checkpoints import api_keys
from fenced_api.app import create_app
from fencing import events, keys, overview
from fencing.connection import get_redis, process_token
from fencing.lease import Lease
from fencing.watchdog import Watchdog
from tasks import submit_run

STATIC = Path(__file__).resolve().parents[1] / "fenced_api" / "static"
XSS = '<img src=x onerror="window.__xss=1">'


@pytest.fixture
def client(mysql_store: str) -> TestClient:
    return TestClient(create_app())


def receive_until(ws: Any, match: Any, limit: int = 200) -> dict[str, Any]:
    for _ in range(limit):
        message = ws.receive_json()
        if match(message):
            return message
    raise AssertionError(f"no matching message in {limit}")


def test_overview_sends_a_snapshot_then_increments(client):
    key = api_keys.issue("ops", admin=True)
    before = submit_run("u1", "already here")
    with client.websocket_connect(f"/api/dashboard/live?key={key}") as ws:
        snap = ws.receive_json()
        assert snap["type"] == "snapshot"
        assert [r["run_id"] for r in snap["runs"]] == [before]
        assert [e["type"] for e in snap["feed"] if e["run_id"] == before] == ["run_queued"]
        assert {"runs_by_state", "dead_letters", "takeovers_seen"} <= set(snap["counters"])

        run_id = submit_run("u2", XSS)
        rows = receive_until(ws, lambda m: m["type"] == "runs" and any(r["run_id"] == run_id for r in m["runs"]))
        row = next(r for r in rows["runs"] if r["run_id"] == run_id)
        assert (row["state"], row["epoch"], row["query"]) == ("queued", 0, XSS)
        assert before not in [r["run_id"] for r in rows["runs"]], "an unchanged run is not sent again"
        queued = receive_until(ws, lambda m: m["type"] == "events")
        assert [(e["run_id"], e["type"]) for e in queued["events"]] == [(run_id, "run_queued")]

        # An event appended to a run's stream arrives once, as recorded.
        events.append(run_id, 0, "probe", "step_started", 0, {"name": XSS})
        got = receive_until(ws, lambda m: m["type"] == "events")
        assert [(e["eid"], e["data"]) for e in got["events"]] == [("probe", {"name": XSS})]
        ws.send_text('{"type":"ping"}')
        receive_until(ws, lambda m: m["type"] == "pong")


def test_overview_is_for_admins_only(client):
    key = api_keys.issue("alice")
    with client.websocket_connect(f"/api/dashboard/live?key={key}") as ws, pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_json()
    assert closed.value.code == 4403
    with pytest.raises(WebSocketDisconnect) as refused, client.websocket_connect("/api/dashboard/live?key=nope") as ws:
        ws.receive_json()
    assert refused.value.code == 1008


def test_a_silent_overview_client_is_closed_with_4408_and_a_pinging_one_is_kept(mysql_store, tmp_path):
    """As on a run's live stream: FENCED_LIVE_SILENT_S without a message from the client closes the
    overview socket with 4408 (the page reconnects for a new snapshot); pings keep it open."""
    from tests.test_api_live import Api

    api = Api(tmp_path, "overview", FENCED_LIVE_SILENT_S="1")
    url = f"ws://127.0.0.1:{api.port}/api/dashboard/live?key={api_keys.issue('ops', admin=True)}"

    async def session(ping_every: float | None) -> tuple[int | None, float, list[str]]:
        started, kinds = time.monotonic(), []
        async with connect(url, ping_interval=None) as ws:  # no protocol pings: only our messages count

            async def pinger() -> None:
                while ping_every is not None:
                    await ws.send('{"type":"ping"}')
                    await asyncio.sleep(ping_every)

            task = asyncio.ensure_future(pinger())
            try:
                async with asyncio.timeout(10 if ping_every is None else 3):
                    while True:
                        kinds.append(json.loads(await ws.recv())["type"])
            except ConnectionClosed as exc:
                return (exc.rcvd.code if exc.rcvd else None), time.monotonic() - started, kinds
            except TimeoutError:
                return None, time.monotonic() - started, kinds  # still open
            finally:
                task.cancel()

    try:
        code, after_s, kinds = asyncio.run(session(None))
        assert code == 4408 and 0.9 < after_s < 5, (code, after_s)
        assert kinds[0] == "snapshot", kinds
        code, after_s, kinds = asyncio.run(session(0.3))
        assert code is None and after_s >= 3, (code, after_s, "a pinging client was dropped")
        assert kinds[0] == "snapshot" and "pong" in kinds, kinds
    finally:
        api.stop()


def test_run_page_is_scoped_to_its_caller(client):
    run_id = submit_run("alice", "a lamp")
    alice, bob, ops = api_keys.issue("alice"), api_keys.issue("bob"), api_keys.issue("ops", admin=True)
    mine = client.get(f"/api/dashboard/runs/{run_id}", headers={"Authorization": f"Bearer {alice}"})
    assert mine.status_code == 200, mine.text
    page = mine.json()
    assert (page["run"]["run_id"], page["run"]["query"], page["steps"]) == (run_id, "a lamp", [])
    assert [e["kind"] for e in page["ledger"]] == ["submitted"]
    assert [e["type"] for e in page["events"]] == ["run_queued"]
    theirs = client.get(f"/api/dashboard/runs/{run_id}", headers={"Authorization": f"Bearer {bob}"})
    missing = client.get("/api/dashboard/runs/no-such-run", headers={"Authorization": f"Bearer {bob}"})
    assert theirs.status_code == missing.status_code == 404
    assert "a lamp" not in theirs.text
    assert client.get(f"/api/dashboard/runs/{run_id}", headers={"Authorization": f"Bearer {ops}"}).status_code == 200
    assert client.get(f"/api/dashboard/runs/{run_id}").status_code == 401
    assert run_id in page["explain"]["summary"], page["explain"]  # tasks.explain's answer, shown as given


def test_static_files_and_no_html_injection(client):
    assert client.get("/", follow_redirects=False).headers["location"] == "/dashboard"
    page = client.get("/dashboard")
    assert page.status_code == 200 and "<script src=\"/dashboard/app.js\">" in page.text
    assert client.get("/dashboard/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/dashboard/..%2Fdashboard.py").status_code == 404
    assert client.get("/dashboard/secrets.txt").status_code == 404
    # Everything shown is data: the page never parses text as HTML.
    script = (STATIC / "app.js").read_text()
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write", script)


def test_watchdog_reports_renew_failures(redis_client):
    """A renewal that finds its lease gone is counted and reported in the next renewal's pipeline."""
    wd = Watchdog(heartbeat_ms=60_000)  # never started: renew_all is called by hand
    lost = Lease("run-lost", ttl_ms=10_000)
    kept = Lease("run-kept", ttl_ms=10_000)
    assert lost.acquire(None) and kept.acquire(None)
    wd.track(lost)
    wd.track(kept)
    get_redis().delete(keys.lease("run-lost"))  # taken from it (a takeover, a cancel, Redis lost it)
    wd.renew_all()
    assert lost.lost and not kept.lost and wd.renew_failures == 1
    wd.renew_all()
    me = next(p for p in overview.processes() if p.token == process_token())
    assert (me.renew_failures, me.runs, me.alive) == (1, ["run-kept"], True)
    assert 0 < overview.lease_left_ms(["run-kept", "run-lost"])["run-kept"] <= 10_000
    assert "run-lost" not in overview.lease_left_ms(["run-kept", "run-lost"])
    assert me.last_seen_ms is not None and me.last_seen_ms <= time.time() * 1000


def test_a_client_that_cannot_keep_up_is_dropped_not_buffered():
    """The hub never queues more than CLIENT_QUEUE messages for one client: past that it is marked
    dropped and its last queued message says so (the socket then closes with 4008 and the page resyncs)."""
    import asyncio

    from fenced_api.overview import CLIENT_QUEUE, Client

    async def flood() -> Client:
        client = Client(asyncio.get_running_loop())
        for i in range(CLIENT_QUEUE + 50):
            client.put({"type": "events", "n": i})
        await asyncio.sleep(0.05)  # let the loop run the queued puts
        return client

    client = asyncio.run(flood())
    assert client.dropped
    assert client.queue.qsize() == CLIENT_QUEUE
    assert [client.queue.get_nowait() for _ in range(CLIENT_QUEUE)][-1] == {"type": "dropped"}


def test_the_hub_keeps_the_newest_ended_runs_and_forgets_the_rest():
    """The runs table holds every live run (up to MAX_LIVE) and the RECENT_ENDED newest ended ones; the
    ones let go are named to the clients (`gone`) and not re-sent until they are written again."""
    from fenced_api.overview import RECENT_ENDED, Hub

    hub = Hub()
    now = int(time.time() * 1000)
    rows = [{"run_id": f"r{i}", "state": "done", "updated_at_ms": now - i} for i in range(RECENT_ENDED + 5)]
    rows.append({"run_id": "live", "state": "running", "updated_at_ms": now - 10_000})
    hub.runs = {r["run_id"]: r for r in rows}
    hub.positions = {r["run_id"]: "0-0" for r in rows}
    hub.since_ms = now
    gone = hub._prune()
    assert sorted(gone) == sorted(f"r{i}" for i in range(RECENT_ENDED, RECENT_ENDED + 5))
    assert "live" in hub.runs and len(hub.runs) == RECENT_ENDED + 1
    assert not set(gone) & set(hub.positions)
    assert hub.gone == {f"r{i}": now - i for i in range(RECENT_ENDED, RECENT_ENDED + 5)}
