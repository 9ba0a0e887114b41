"""The service front ends call (tasks/service.py): scoped to the caller, paginated, JSON-ready."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from checkpoints import inputs, ledger, runs
from fenced_core.errors import InvalidRequest, RunNotFound
from fencing import epoch, events
from tasks import service, submit_run


def _running(user_id: str, query: str = "buy a lamp") -> runs.Claim:
    c = runs.claim(submit_run(user_id, query), "w/1")
    assert c is not None
    epoch.raise_epoch(c.run.run_id, c.epoch)
    return c


def _waiting(user_id: str) -> runs.Claim:
    c = _running(user_id)
    assert inputs.ask(c, "call-1", 1, "which brand?") is None
    runs.park(c, "which brand?", {}, runs.Usage(), "")
    return c


def test_another_users_run_is_not_found_exactly_as_a_missing_one(mysql_store, redis_client):
    c = _waiting("alice")
    run_id = c.run.run_id
    before = [e.kind for e in ledger.history(run_id)]
    calls = {
        "get_run": lambda rid: service.get_run(rid, "mallory"),
        "status": lambda rid: service.status(rid, "mallory"),
        "events": lambda rid: service.events(rid, "mallory"),
        "ledger_of": lambda rid: service.ledger_of(rid, "mallory"),
        "cancel": lambda rid: service.cancel(rid, "mallory", "mallory"),
        "reply": lambda rid: service.reply(rid, "Acme", "mallory", "mallory"),
        "resolve_id": lambda rid: service.resolve_id(rid, "mallory"),
    }
    missing = "5e0d1c2b-0000-4000-8000-000000000000"
    for name, call in calls.items():
        with pytest.raises(RunNotFound) as theirs:
            call(run_id)
        with pytest.raises(RunNotFound) as nobodys:
            call(missing)
        assert str(theirs.value).replace(run_id, "ID") == str(nobodys.value).replace(missing, "ID"), name
    with pytest.raises(RunNotFound):
        service.resolve_id(run_id[:8], "mallory")  # a prefix does not reveal it either
    assert runs.get_run(run_id).state == "waiting", "nothing was cancelled or answered"  # type: ignore[union-attr]
    assert [e.kind for e in ledger.history(run_id)] == before
    assert service.get_run(run_id, "alice").state == "waiting" and service.get_run(run_id).user_id == "alice"


def test_status_shows_the_question_the_hold_and_serialises(mysql_store, redis_client):
    c = _waiting("alice")
    run_id = c.run.run_id
    shown = service.status(run_id, "alice")
    assert shown.run.question is not None and shown.run.question.question == "which brand?"
    assert [h["state"] for h in shown.run.holds] == ["held"]
    assert shown.ledger_entries == len(ledger.history(run_id)) and shown.ledger[-1].kind == "waiting"
    data = json.loads(json.dumps(asdict(shown), default=str))
    assert data["run"]["question"]["tool_call_id"] == "call-1" and "checkpoint" not in data["run"]

    answered = service.reply(run_id, "Acme", "alice", "alice")
    assert answered.reply == "Acme"
    view = service.get_run(run_id, "alice")
    assert (view.state, view.question) == ("queued", None)
    with pytest.raises(InvalidRequest, match="must not be empty"):
        service.reply(run_id, "  ", "alice", "alice")


def test_list_runs_pages_through_the_callers_runs_only(mysql_store, redis_client):
    mine = [submit_run("u1", f"query {i}") for i in range(5)]
    theirs = [submit_run("u2", "other") for _ in range(2)]
    pages, cursor = [], None
    while True:
        page = service.list_runs("u1", limit=2, cursor=cursor)
        pages.append([r.run_id for r in page.runs])
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [r for p in pages for r in p] == mine[::-1], "newest first, each once"
    everyone = service.list_runs(limit=100)
    assert {r.run_id for r in everyone.runs} == set(mine + theirs) and everyone.next_cursor is None
    assert service.list_runs("u2", state="done").runs == []
    json.dumps([r.to_dict() for r in everyone.runs])
    for bad, field in ((dict(state="bogus"), "state"), (dict(limit=0), "limit"), (dict(cursor="%%"), "cursor")):
        with pytest.raises(InvalidRequest, match=field):
            service.list_runs("u1", **bad)  # type: ignore[arg-type]


def test_events_live_view_raw_and_increments(mysql_store, redis_client):
    c = _running("alice")
    run_id = c.run.run_id
    first = events.append(run_id, c.epoch, "tool:1", "tool_started", 0, {"n": 1})
    # A replayed duplicate: the step run again by the next holder (the same event id under a newer epoch;
    # the same epoch's repeat of the newest entry is that entry, never a copy: append_event.lua).
    events.append(run_id, c.epoch + 1, "tool:1", "tool_started", 0, {"n": 1})
    live, raw = service.events(run_id, "alice"), service.events(run_id, "alice", raw=True)
    assert [e.eid for e in live.events].count("tool:1") == 1 and live.stored == raw.stored == len(raw.events)
    assert len(raw.events) > len(live.events)
    since = service.events(run_id, "alice", after=first)
    assert [e.eid for e in since.events] == ["tool:1"] and since.events[0].stream_id != first
    with pytest.raises(InvalidRequest, match="after"):
        service.events(run_id, "alice", after="not-an-id")
    assert [e.kind for e in service.ledger_of(run_id, "alice")] == [e.kind for e in ledger.history(run_id)]


def test_cancel_through_the_service_and_replay_is_operator_only(mysql_store, redis_client):
    c = _running("alice")
    done = service.cancel(c.run.run_id, "alice", "alice")
    assert not done.noop and service.get_run(c.run.run_id).state == "cancelled"
    assert service.cancel(c.run.run_id, "alice", "alice").noop
    assert "user_id" not in service.replay_dead_letter.__code__.co_varnames, "no user may replay"
    with pytest.raises(InvalidRequest, match="only dead runs"):
        service.replay_dead_letter(c.run.run_id, "ops")
    assert service.dead_letters() == []
