"""The JSON API (fenced_api): keys, submit with idempotency, scoping (another user's run is a 404), errors
that name the field and write nothing, admin routes, on real Redis and MariaDB, in process and through
real workers and two uvicorn replicas."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import Depends, FastAPI, WebSocket
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

import checkpoints.db
from checkpoints import api_keys, inputs, runs
from checkpoints.db import transaction
from checkpoints.schema import metadata, user_accounts
from examples.shopping import cards as shop_cards
from examples.shopping.schema import metadata as shopping_metadata
from fenced_api.app import create_app
from fenced_api.auth import Caller, caller
from fencing import epoch
from tasks import submit_run
from tests.conftest import ROOT, TEST_ENV

MISSING = "5e0d1c2b-0000-4000-8000-000000000000"


@dataclass
class Api:
    """An in-process client of a fresh app, and keys for alice, bob (users) and ops (admin)."""

    client: TestClient
    keys: dict[str, str]

    def h(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}

    def call(self, who: str, method: str, path: str, **kw: Any) -> Any:
        return self.client.request(method, path, headers={**self.h(who), **kw.pop("headers", {})}, **kw)


def reset_keys() -> dict[str, str]:
    with transaction() as conn:
        conn.execute(api_keys.api_keys.delete())
    return {"alice": api_keys.issue("alice"), "bob": api_keys.issue("bob"), "ops": api_keys.issue("ops", admin=True)}


@pytest.fixture
def api(mysql_store: str) -> Iterator[Api]:
    keys = reset_keys()
    app = create_app()
    try:
        with TestClient(app) as client:
            yield Api(client, keys)
    finally:
        checkpoints.db._retry_window_s = None  # create_app shortened it for this (test) process


def footprint(redis_client: Any) -> dict[str, Any]:
    """Everything a request could write: the row count of every table (and the credits held), and every
    Redis key with its size. Equal before and after a refused request: it wrote nothing."""
    out: dict[str, Any] = {}
    with transaction(readonly=True) as conn:
        for table in [*metadata.sorted_tables, *shopping_metadata.sorted_tables, api_keys.api_keys]:
            out[table.name] = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar()
        out["held"] = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(user_accounts.c.held_credits), 0))).scalar()
    sizes = {"zset": "zcard", "hash": "hlen", "list": "llen", "stream": "xlen", "set": "scard", "string": "strlen"}
    for key in redis_client.keys("*"):
        kind = _text(redis_client.type(key))
        out[f"redis:{_text(key)}"] = getattr(redis_client, sizes[kind])(key) if kind in sizes else kind
    return out


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _running(user_id: str, query: str = "buy a lamp") -> runs.Claim:
    c = runs.claim(submit_run(user_id, query), "w/1")
    assert c is not None
    epoch.raise_epoch(c.run.run_id, c.epoch)
    return c


def _waiting(user_id: str, query: str = "buy a lamp", c: runs.Claim | None = None) -> runs.Claim:
    c = c or _running(user_id, query)
    assert inputs.ask(c, "call-1", 1, "which brand?") is None
    runs.park(c, "which brand?", {}, runs.Usage(), "")
    return c


# -- keys and the caller --------------------------------------------------------------------------------
def test_a_key_names_its_user_only_its_digest_is_stored_and_revoking_stops_it(api: Api):
    key = api.keys["alice"]
    assert key.startswith("fk_") and len(key) >= 40
    with transaction(readonly=True) as conn:
        stored = conn.execute(sa.select(api_keys.api_keys)).mappings().all()
    assert {r["user_id"]: r["admin"] for r in stored} == {"alice": False, "bob": False, "ops": True}
    assert all(key not in str(dict(r)) for r in stored), "the key itself is never stored"
    assert api_keys.lookup(key) == api_keys.KeyOwner("alice", False)

    assert api.client.get("/api/runs").status_code == 401
    assert api.client.get("/api/runs").headers["www-authenticate"] == "Bearer"
    assert api.client.get("/api/runs", headers={"Authorization": "Bearer " + key[:-1]}).status_code == 401
    assert api.client.get("/api/runs", headers={"Authorization": f"Basic {key}"}).status_code == 401
    assert api.client.get(f"/api/runs?key={key}").status_code == 200, "?key= for browser WebSockets"
    assert api.call("alice", "GET", "/api/runs").status_code == 200
    assert api_keys.revoke_user("alice") == 1
    assert api.call("alice", "GET", "/api/runs").status_code == 401
    assert api.call("bob", "GET", "/api/runs").status_code == 200


def test_caller_works_on_a_websocket_and_closes_it_with_1008_without_a_key(api: Api):
    app = FastAPI()

    @app.websocket("/ws")
    async def ws(socket_: WebSocket, who: Caller = Depends(caller)) -> None:
        await socket_.accept()
        await socket_.send_json({"user": who.user_id})
        await socket_.close()

    client = TestClient(app)
    with client.websocket_connect(f"/ws?key={api.keys['bob']}") as conn:
        assert conn.receive_json() == {"user": "bob"}
    with pytest.raises(WebSocketDisconnect) as closed, client.websocket_connect("/ws?key=nope") as conn:
        conn.receive_json()
    assert closed.value.code == 1008


def test_user_names_are_checked_before_a_key_is_issued(mysql_store):
    for bad in ["", " alice", "a\nb", "x" * 129]:
        with pytest.raises(ValueError, match="user name"):
            api_keys.issue(bad)


# -- submit -------------------------------------------------------------------------------------------
def test_submit_creates_a_run_and_a_retry_with_the_same_key_returns_it(api: Api, redis_client):
    first = api.call("alice", "POST", "/api/runs", json={"input": "find a lamp", "idempotency_key": "k-1"})
    assert first.status_code == 201, first.text
    run = first.json()
    assert (run["state"], run["input"], run["agent"], run["kind"]) == ("queued", "find a lamp", "shopping", "normal")
    assert run["charge"] == {"state": "held", "held_credits": 20, "charged_credits": None}
    assert run["agent_version"], "the agent's version is recorded"
    before = footprint(redis_client)
    again = api.call("alice", "POST", "/api/runs", json={"input": "find a lamp"}, headers={"Idempotency-Key": "k-1"})
    assert again.status_code == 200 and again.json()["run_id"] == run["run_id"]
    assert footprint(redis_client) == before, "a retried POST creates nothing"
    # The same key is the user's own: bob's k-1 is another run.
    theirs = api.call("bob", "POST", "/api/runs", json={"input": "find a lamp", "idempotency_key": "k-1"})
    assert theirs.status_code == 201 and theirs.json()["run_id"] != run["run_id"]
    before = footprint(redis_client)
    other = api.call("alice", "POST", "/api/runs", json={"input": "find a chair", "idempotency_key": "k-1"})
    assert other.status_code == 409 and "idempotency key" in other.json()["detail"]
    both = api.call("alice", "POST", "/api/runs", json={"input": "x", "idempotency_key": "k-2"},
                    headers={"Idempotency-Key": "k-3"})
    assert both.status_code == 422 and both.json()["errors"][0]["field"] == "idempotency_key"
    assert footprint(redis_client) == before


@pytest.mark.parametrize(("body", "field"), [
    ({}, "input"),
    ({"input": "   "}, "input"),
    ({"input": "x" * 16_001}, "input"),
    ({"input": 42}, "input"),
    ({"input": "ok", "kind": "huge"}, "kind"),
    ({"input": "ok", "agent": "no-such-agent"}, "agent"),
    ({"input": "ok", "agent": ""}, "agent"),
    ({"input": "ok", "idempotency_key": ""}, "idempotency_key"),
    ({"input": "ok", "idempotency_key": "k" * 201}, "idempotency_key"),
    ({"input": "ok", "user_id": "bob"}, "user_id"),
    ({"input": "a\x00b"}, "input"),
])
def test_bad_submits_are_422_naming_the_field_and_write_nothing(api: Api, redis_client, body, field):
    before = footprint(redis_client)
    r = api.call("alice", "POST", "/api/runs", json=body)
    assert r.status_code == 422, r.text
    assert field in [e["field"] for e in r.json()["errors"]] and field in r.json()["detail"]
    assert r.json()["code"] == "invalid_input"
    assert footprint(redis_client) == before


@pytest.mark.parametrize("raw", [b'{"input": "\\ud800"}', b'{"input": ', b'["input"]', b"\xff\xfe"])
def test_malformed_json_and_lone_surrogates_are_refused_not_500(api: Api, redis_client, raw):
    before = footprint(redis_client)
    r = api.call("alice", "POST", "/api/runs", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert footprint(redis_client) == before


def test_admission_refused_is_429_with_retry_after_and_writes_nothing(api: Api, redis_client, settings_env):
    settings_env(max_runs_per_user=1)
    assert api.call("alice", "POST", "/api/runs", json={"input": "one"}).status_code == 201
    before = footprint(redis_client)
    r = api.call("alice", "POST", "/api/runs", json={"input": "two", "idempotency_key": "k-2"})
    assert r.status_code == 429, r.text
    assert r.headers["Retry-After"].isdigit() and int(r.headers["Retry-After"]) >= 1
    assert r.json()["code"] == "too_many_runs_user"
    assert footprint(redis_client) == before, "no row, no hold, no admission slot"
    assert api.call("bob", "POST", "/api/runs", json={"input": "two"}).status_code == 201, "per user"


def test_insufficient_credits_is_402_and_writes_nothing(api: Api, redis_client, settings_env):
    settings_env(default_balance_credits=30)
    assert api.call("alice", "POST", "/api/runs", json={"input": "one"}).status_code == 201
    before = footprint(redis_client)
    r = api.call("alice", "POST", "/api/runs", json={"input": "two", "kind": "large"})
    assert r.status_code == 402 and "credits" in r.json()["detail"], r.text
    assert footprint(redis_client) == before


# -- read, list, cancel, reply, confirm ---------------------------------------------------------------
def test_get_shows_the_question_and_list_pages_through_the_callers_runs_only(api: Api):
    c = _waiting("alice")
    got = api.call("alice", "GET", f"/api/runs/{c.run.run_id}").json()
    assert (got["state"], got["epoch"], got["question"]["text"]) == ("waiting", c.epoch, "which brand?")
    mine = [c.run.run_id] + [api.call("alice", "POST", "/api/runs", json={"input": f"q{i}"}).json()["run_id"]
                             for i in range(4)]
    api.call("bob", "POST", "/api/runs", json={"input": "bob's"})
    seen, cursor = [], None
    while True:
        page = api.call("alice", "GET", "/api/runs", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        seen += [r["run_id"] for r in page.json()["runs"]]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(mine))
    waiting = api.call("alice", "GET", "/api/runs", params={"state": "waiting"}).json()["runs"]
    assert [r["run_id"] for r in waiting] == [c.run.run_id]
    bad = api.call("alice", "GET", "/api/runs", params={"state": "sleeping", "limit": 0})
    assert bad.status_code == 422 and {e["field"] for e in bad.json()["errors"]} == {"query.state", "query.limit"}
    forged = api.call("alice", "GET", "/api/runs", params={"cursor": "bm90LWEtY3Vyc29y"})
    assert forged.status_code == 422 and forged.json()["errors"][0]["field"] == "query.cursor"


def test_another_users_run_and_card_are_404_exactly_as_missing_ones(api: Api, redis_client):
    c = _running("alice")
    card = shop_cards.create_cart_card(c, [{"id": "sku-001", "name": "lamp", "price_cents": 100}])
    _waiting("alice", c=c)
    run_id = c.run.run_id
    before = footprint(redis_client)
    for path, body in [("/api/runs/{}", None), ("/api/runs/{}/cancel", None),
                       ("/api/runs/{}/reply", {"text": "Acme"})]:
        method = "GET" if body is None and not path.endswith("cancel") else "POST"
        theirs = api.call("bob", method, path.format(run_id), json=body)
        nobodys = api.call("bob", method, path.format(MISSING), json=body)
        assert theirs.status_code == nobodys.status_code == 404, (path, theirs.text)
        assert theirs.json() == nobodys.json()
    theirs = api.call("bob", "POST", f"/api/cards/{card.card_id}/confirm")
    nobodys = api.call("bob", "POST", "/api/cards/card_0000000000000000/confirm")
    assert theirs.status_code == nobodys.status_code == 404 and theirs.json() == nobodys.json()
    assert footprint(redis_client) == before, "nothing cancelled, answered or ordered"
    assert api.call("alice", "GET", f"/api/runs/{run_id}").json()["cards"][0]["card_id"] == card.card_id


def test_an_operator_reads_any_run_but_acts_only_on_its_own(api: Api, redis_client):
    c = _waiting("alice")
    run_id = c.run.run_id
    shown = api.call("ops", "GET", f"/api/runs/{run_id}")
    assert shown.status_code == 200 and shown.json()["state"] == "waiting", "as on its stream and dashboard page"
    before = footprint(redis_client)
    assert api.call("ops", "POST", f"/api/runs/{run_id}/cancel").status_code == 404
    assert api.call("ops", "POST", f"/api/runs/{run_id}/reply", json={"text": "Acme"}).status_code == 404
    assert footprint(redis_client) == before, "an operator's read acts on nothing"


def test_reply_answers_a_waiting_run_and_409s_otherwise(api: Api, redis_client):
    c = _waiting("alice")
    r = api.call("alice", "POST", f"/api/runs/{c.run.run_id}/reply", json={"text": "Acme"})
    assert r.status_code == 200 and r.json() == {"run_id": c.run.run_id, "question": "which brand?", "reply": "Acme",
                                                 "state": "queued"}
    assert api.call("alice", "GET", f"/api/runs/{c.run.run_id}").json()["state"] == "queued"
    before = footprint(redis_client)
    again = api.call("alice", "POST", f"/api/runs/{c.run.run_id}/reply", json={"text": "Acme"})
    assert again.status_code == 409 and "not waiting" in again.json()["detail"]
    empty = api.call("alice", "POST", f"/api/runs/{c.run.run_id}/reply", json={"text": " "})
    assert empty.status_code == 422 and empty.json()["errors"][0]["field"] == "text"
    assert footprint(redis_client) == before


def test_cancel_ends_the_run_and_a_second_cancel_is_a_noop(api: Api):
    run_id = api.call("alice", "POST", "/api/runs", json={"input": "lamp"}).json()["run_id"]
    r = api.call("alice", "POST", f"/api/runs/{run_id}/cancel")
    assert r.status_code == 200 and r.json()["noop"] is False and r.json()["previous_state"] == "queued"
    again = api.call("alice", "POST", f"/api/runs/{run_id}/cancel").json()
    assert (again["noop"], again["state"]) == (True, "cancelled")
    shown = api.call("alice", "GET", f"/api/runs/{run_id}").json()
    assert shown["state"] == "cancelled" and shown["charge"]["state"] in ("settled", "released")


def test_a_double_click_on_confirm_yields_one_order(api: Api, redis_client):
    c = _running("alice")
    card = shop_cards.create_cart_card(c, [{"id": "sku-001", "name": "lamp", "price_cents": 100}])
    first = api.call("alice", "POST", f"/api/cards/{card.card_id}/confirm")
    second = api.call("alice", "POST", f"/api/cards/{card.card_id}/confirm")
    assert first.status_code == second.status_code == 200
    assert first.json()["order_id"] == second.json()["order_id"] and second.json()["reused"] is True
    assert api.call("alice", "GET", f"/api/runs/{c.run.run_id}").json()["cards"][0]["state"] == "confirmed"
    # A card of a cancelled run cannot be ordered: 409, nothing written.
    c2 = _running("alice")
    card2 = shop_cards.create_cart_card(c2, [{"id": "sku-001", "name": "lamp", "price_cents": 100}])
    api.call("alice", "POST", f"/api/runs/{c2.run.run_id}/cancel")
    before = footprint(redis_client)
    refused = api.call("alice", "POST", f"/api/cards/{card2.card_id}/confirm")
    assert refused.status_code == 409 and "cancelled" in refused.json()["detail"]
    assert footprint(redis_client) == before


# -- admin --------------------------------------------------------------------------------------------
def test_dead_letters_are_for_admins_and_a_replay_queues_the_run(api: Api, redis_client):
    c = _running("alice")
    runs.dead_letter(c, "poison", {})
    run_id = c.run.run_id
    for path, method in [("/api/admin/dead-letters", "GET"), (f"/api/admin/dead-letters/{run_id}", "GET"),
                         (f"/api/admin/dead-letters/{run_id}/replay", "POST")]:
        r = api.call("alice", method, path)
        assert r.status_code == 403 and r.json()["code"] == "forbidden", path
    assert api.client.get("/api/admin/dead-letters").status_code == 401
    listed = api.call("ops", "GET", "/api/admin/dead-letters").json()
    assert [d["run_id"] for d in listed] == [run_id] and listed[0]["reason"] == "poison"
    assert api.call("ops", "GET", f"/api/admin/dead-letters/{run_id}").json()["step"] == c.run.step
    assert api.call("ops", "GET", f"/api/admin/dead-letters/{MISSING}").status_code == 404
    live = _running("bob")
    before = footprint(redis_client)
    assert api.call("ops", "POST", f"/api/admin/dead-letters/{live.run.run_id}/replay").status_code == 409
    assert api.call("ops", "POST", f"/api/admin/dead-letters/{MISSING}/replay").status_code == 404
    assert footprint(redis_client) == before
    replayed = api.call("ops", "POST", f"/api/admin/dead-letters/{run_id}/replay")
    assert replayed.status_code == 200 and replayed.json() == {"run_id": run_id, "step": c.run.step, "state": "queued"}
    assert runs.get_run(run_id).state == "queued"  # type: ignore[union-attr]


def test_the_openapi_document_lists_every_route_with_the_bearer_scheme(api: Api):
    spec = api.client.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    ours = {p: ops for p, ops in spec["paths"].items() if p.startswith("/api/") and "/admin/" not in p}
    assert {"/api/runs", "/api/runs/{run_id}", "/api/runs/{run_id}/cancel", "/api/runs/{run_id}/reply",
            "/api/cards/{card_id}/confirm"} <= set(ours)
    assert all(op["security"] == [{"bearer": []}] for ops in ours.values() for op in ops.values())
    assert spec["paths"]["/api/admin/dead-letters"]["get"]["responses"]["403"]


# -- real workers and two replicas ---------------------------------------------------------------------
def test_end_to_end_a_worker_runs_it_the_user_replies_confirms_and_another_user_sees_nothing(api: Api, workers):
    from tests.workers_fixture import wait_for

    workers.start("w1")
    r = api.call("alice", "POST", "/api/runs", json={"input": "buy a desk lamp [ask]"})
    assert r.status_code == 201, r.text
    run_id = r.json()["run_id"]
    get = lambda: api.call("alice", "GET", f"/api/runs/{run_id}").json()  # noqa: E731
    waiting = wait_for(lambda: (g := get())["state"] == "waiting" and g, 60, "the run to ask")
    assert waiting["question"]["text"] == "Any preferred brand?"
    assert api.call("alice", "POST", f"/api/runs/{run_id}/reply", json={"text": "Acme"}).status_code == 200
    done = wait_for(lambda: (g := get())["state"] == "done" and g, 60, "the run to finish")
    assert "Acme" in done["answer"] and done["usage"]["model_calls"] >= 4
    assert done["charge"]["state"] == "settled" and done["charge"]["charged_credits"] > 0
    card_id = done["cards"][0]["card_id"]
    orders = {api.call("alice", "POST", f"/api/cards/{card_id}/confirm").json()["order_id"] for _ in range(2)}
    assert len(orders) == 1
    for method, path, body in [("GET", f"/api/runs/{run_id}", None), ("POST", f"/api/runs/{run_id}/cancel", None),
                               ("POST", f"/api/runs/{run_id}/reply", {"text": "x"}),
                               ("POST", f"/api/cards/{card_id}/confirm", None)]:
        assert api.call("bob", method, path, json=body).status_code == 404, path
    assert run_id not in str(api.call("bob", "GET", "/api/runs").json())
    assert get()["state"] == "done"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **TEST_ENV, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "fenced_cli", "api", "--port", str(port), "--log-level", "warning"],
                            cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def test_two_replicas_serve_the_same_clients(api: Api, tmp_path: Path):
    ports = [_free_port(), _free_port()]
    procs = [_serve(p, tmp_path / f"api-{p}.log") for p in ports]
    try:
        one, two = (httpx.Client(base_url=f"http://127.0.0.1:{p}", headers=api.h("alice"), timeout=10) for p in ports)
        deadline = time.monotonic() + 30
        for client in (one, two):
            while True:
                try:
                    if client.get("/openapi.json").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, [f.read_text()[-2000:] for f in tmp_path.glob("api-*.log")]
                time.sleep(0.2)
        run_id = one.post("/api/runs", json={"input": "lamp", "idempotency_key": "r-1"}).json()["run_id"]
        assert two.post("/api/runs", json={"input": "lamp", "idempotency_key": "r-1"}).json()["run_id"] == run_id
        assert two.get(f"/api/runs/{run_id}").json()["state"] == "queued"
        assert two.post(f"/api/runs/{run_id}/cancel").json()["noop"] is False
        assert one.get(f"/api/runs/{run_id}").json()["state"] == "cancelled"
        c = _waiting("alice")
        assert one.post(f"/api/runs/{c.run.run_id}/reply", json={"text": "Acme"}).status_code == 200
        assert two.get(f"/api/runs/{c.run.run_id}").json()["state"] == "queued"
        assert two.get(f"/api/runs/{run_id}", headers=api.h("bob")).status_code == 404
        # The same retried POST racing on both replicas at once: one run.
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: (one, two)[i % 2].post(
                "/api/runs", json={"input": "race", "idempotency_key": "r-2"}), range(8)))
        assert all(a.status_code in (200, 201) for a in answers), [a.text for a in answers]
        assert len({a.json()["run_id"] for a in answers}) == 1
        assert [r["input"] for r in one.get("/api/runs", params={"limit": 100}).json()["runs"]].count("race") == 1
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def test_users_add_prints_a_working_key_once_and_refuses_a_bad_name(mysql_store):
    from typer.testing import CliRunner

    from fenced_cli import app

    added = CliRunner().invoke(app, ["users", "add", "carol", "--admin"])
    assert added.exit_code == 0, added.output
    key = added.output.strip()
    assert api_keys.lookup(key) == api_keys.KeyOwner("carol", True)
    bad = CliRunner().invoke(app, ["users", "add", " carol"])
    assert bad.exit_code == 2 and "user name" in bad.output
    revoked = CliRunner().invoke(app, ["users", "revoke", "carol"])
    assert revoked.exit_code == 0 and api_keys.lookup(key) is None


def test_redis_down_is_503_with_retry_after_and_reads_still_work(api: Api, redis_client, settings_env):
    from fencing import connection

    run_id = api.call("alice", "POST", "/api/runs", json={"input": "lamp"}).json()["run_id"]
    before = footprint(redis_client)
    settings_env(redis_url="redis://127.0.0.1:6399/0")  # nothing listens there
    connection.reset()
    try:
        r = api.call("alice", "POST", "/api/runs", json={"input": "another lamp"})
        assert r.status_code == 503 and r.json()["code"] == "unavailable", r.text
        assert r.headers["Retry-After"].isdigit()
        assert api.call("alice", "GET", f"/api/runs/{run_id}").json()["state"] == "queued"
    finally:
        settings_env(redis_url=TEST_ENV["FENCED_REDIS_URL"])
        connection.reset()
    assert footprint(redis_client) == before


def test_a_nul_in_the_idempotency_key_header_is_a_422_naming_it(api: Api, redis_client):
    before = footprint(redis_client)
    r = api.call("alice", "POST", "/api/runs", json={"input": "lamp"}, headers={"Idempotency-Key": "a\x00b"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "header.idempotency-key", r.text
    assert footprint(redis_client) == before
