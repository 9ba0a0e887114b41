"""Admission (admit.lua through fencing.admission and submit_run) and the large-run promoter, on real Redis."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import redis
import sqlalchemy as sa

from checkpoints import accounts, ledger, runs
from checkpoints.db import transaction
from checkpoints.schema import run_checkpoints, run_holds, user_accounts
from fenced_core.errors import AdmissionRefused, InsufficientCredits
from fencing import admission, keys
from fencing.connection import get_redis
from fencing.fairness import promote_large, run_id_of
from tasks import queues, submit_run
from tests.workers_fixture import wait_for, wait_terminal

QUEUES = (queues.NORMAL, queues.LARGE)


@pytest.fixture
def limits(settings_env: Callable[..., None]) -> Callable[..., None]:
    """Set FENCED_* settings for this process for one test: limits(max_runs_per_user=2, ...)."""
    return settings_env


def count(table: sa.Table) -> int:
    with transaction() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() or 0)


def slots(client: redis.Redis, user_id: str) -> list[str]:
    return list(client.zrange(keys.user_slots(user_id), 0, -1))  # type: ignore[arg-type]


def first_claim_ms(run_id: str) -> int | None:
    return next((e.at_ms for e in ledger.history(run_id) if e.kind in ("claimed", "takeover")), None)


# -- the script -----------------------------------------------------------------------------------------
def test_admits_up_to_the_user_limit_then_refuses(redis_client, limits):
    limits(max_runs_per_user=3, max_queued_runs=100)
    for i in range(3):
        got = admission.admit(f"r{i}", "u1", QUEUES)
        assert (got.user_runs, got.waiting) == (i + 1, i + 1)
    with pytest.raises(AdmissionRefused) as refused:
        admission.admit("r3", "u1", QUEUES)
    assert refused.value.limit == "user" and 0 < refused.value.retry_after_s <= admission.RETRY_AFTER_USER_S
    assert "max_runs_per_user=3" in str(refused.value) and "'u1'" in str(refused.value)
    assert "r3" not in slots(redis_client, "u1"), "a refusal takes nothing"
    assert admission.admit("r0", "u1", QUEUES).user_runs == 3, "admitting the same run again changes nothing"
    assert admission.admit("other", "u2", QUEUES).user_runs == 1, "the limit is per user"


def test_global_limit_counts_undelivered_and_admitted_not_sent(redis_client, limits):
    limits(max_runs_per_user=100, max_queued_runs=3)
    redis_client.lpush(keys.broker_queue(queues.NORMAL), "m1")
    redis_client.lpush(keys.broker_queue(queues.LARGE), "m2")
    redis_client.lpush(keys.broker_queue(queues.CONTINUE), *[f"c{i}" for i in range(5)])  # runs in flight
    assert admission.admit("a", "u1", QUEUES).waiting == 3
    with pytest.raises(AdmissionRefused) as refused:
        admission.admit("b", "u2", QUEUES)
    assert refused.value.limit == "global" and refused.value.retry_after_s == admission.RETRY_AFTER_GLOBAL_S
    assert "3 runs are waiting" in str(refused.value) and "max_queued_runs=3" in str(refused.value)
    assert slots(redis_client, "u2") == []
    admission.mark_sent("a")  # sent and then delivered: only the two messages remain
    assert admission.admit("b", "u2", QUEUES).waiting == 3


def test_stale_slots_are_pruned(redis_client, limits):
    limits(max_runs_per_user=2, max_queued_runs=2, admission_ttl_s=60)
    long_ago = int(time.time() * 1000) - 61_000
    redis_client.zadd(keys.user_slots("u1"), {"crashed-1": long_ago, "crashed-2": long_ago})
    redis_client.zadd(keys.ADMITTED_UNSENT, {"dead-submitter-1": long_ago - admission.UNSENT_TTL_MS,
                                             "dead-submitter-2": long_ago - admission.UNSENT_TTL_MS})
    got = admission.admit("fresh", "u1", QUEUES)
    assert (got.user_runs, got.waiting) == (1, 1)
    assert slots(redis_client, "u1") == ["fresh"]
    assert redis_client.zrange(keys.ADMITTED_UNSENT, 0, -1) == ["fresh"]
    assert 0 < redis_client.pttl(keys.user_slots("u1")) <= 60_000, "an idle user's key expires with its slots"


def test_release_frees_a_slot(redis_client, limits):
    limits(max_runs_per_user=1)
    admission.admit("r1", "u1", QUEUES)
    with pytest.raises(AdmissionRefused):
        admission.admit("r2", "u1", QUEUES)
    assert admission.release_slot("u1", "r1") is True
    assert admission.release_slot("u1", "r1") is False, "idempotent"
    admission.admit("r2", "u1", QUEUES)
    assert slots(redis_client, "u1") == ["r2"]


def test_a_slot_release_rides_ahead_of_an_event_append(redis_client, limits):
    """A run's final event carries its slot release (tasks.endings.finished): one call of Appends.send, the
    release ahead of the append (on a cluster, in a round trip of its own before it), each reply in its
    place: the event's stream id back, the slot free, the slot owner gone; a second release frees nothing."""
    from fencing import events

    limits(max_runs_per_user=1)
    admission.admit("ride-1", "u1", QUEUES)
    assert slots(redis_client, "u1") == ["ride-1"]
    appends = events.Appends("ride-1", 0, [("run:done", "run_done", 3, {"answer": "ok"})])
    ids = appends.send(client=get_redis(), riders=[admission.release_call("u1", "ride-1")])
    assert slots(redis_client, "u1") == [] and redis_client.hget(admission.SLOT_OWNERS, "ride-1") is None
    assert [fields["eid"] for _id, fields in redis_client.xrange(keys.events("ride-1"))] == ["run:done"]
    assert ids == [redis_client.xrange(keys.events("ride-1"))[0][0]], "the append's own reply, not the release's"
    admission.admit("ride-2", "u1", QUEUES)  # the slot is free for the user's next run
    assert admission.release_slot("u1", "ride-1") is False


def test_a_release_riding_with_appends_that_landed_already_still_goes(redis_client, limits):
    """Appends whose earlier round trip failed (`unsettled`) and had landed are not appended again; the
    release riding with them is still sent."""
    from fencing import events

    limits(max_runs_per_user=1)
    admission.admit("ride-u", "u1", QUEUES)
    appends = events.Appends("ride-u", 0, [("run:done", "run_done", 3, {})])
    appends.send(client=get_redis())  # landed, but its reply was lost:
    appends.unsettled, appends.ids = True, None
    appends.send(client=get_redis(), riders=[admission.release_call("u1", "ride-u")])
    assert len(redis_client.xrange(keys.events("ride-u"))) == 1 and slots(redis_client, "u1") == []


def test_a_release_that_goes_alone_and_fails_never_holds_the_append_back(redis_client, limits, monkeypatch):
    """Where the release goes in a round trip of its own (a cluster, where the admission keys live on another
    node than the run's stream; an unsettled retry), its failure is logged and the append still goes: the
    slot is left to the sweeper's reconcile, the final event is not lost with it."""
    from fencing import events, scripts
    from fencing.connection import RedisUnavailable

    limits(max_runs_per_user=1)
    admission.admit("ride-f", "u1", QUEUES)
    real = scripts.Scripts.execute_all

    def failing(self, client, calls, raise_on_error=True):  # type: ignore[no-untyped-def]
        if calls and all(c.script == "release_slot" for c in calls):
            raise RedisUnavailable("the admission node is down")
        return real(self, client, calls, raise_on_error)

    monkeypatch.setattr(scripts.Scripts, "execute_all", failing)
    appends = events.Appends("ride-f", 0, [("run:done", "run_done", 3, {})])
    appends.unsettled = True  # on one Redis, the alone path is an unsettled retry's
    appends.send(client=get_redis(), riders=[admission.release_call("u1", "ride-f")])
    assert [f["eid"] for _id, f in redis_client.xrange(keys.events("ride-f"))] == ["run:done"]
    assert slots(redis_client, "u1") == ["ride-f"], "the failed release freed nothing"
    assert appends.riders_ran is False, "a lease release among them is then made by its delivery"


def test_unreachable_redis_refuses(limits):
    limits()
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    with pytest.raises(AdmissionRefused) as refused:
        admission.admit("r1", "u1", QUEUES, client=dead)
    assert refused.value.limit == "unavailable"
    assert admission.release_slot("u1", "r1", client=dead) is False, "a release never raises"


# -- submit_run -----------------------------------------------------------------------------------------
def test_refusals_write_nothing(store, redis_client, limits):
    limits(max_runs_per_user=1)
    kept = submit_run("u1", "buy headphones")
    before = accounts.get_account("u1")
    assert (before.balance_credits, before.held_credits) == (1000, 20)
    with pytest.raises(AdmissionRefused):
        submit_run("u1", "buy a lamp")
    assert [r.run_id for r in runs.list_runs()] == [kept]
    assert (count(run_checkpoints), count(run_holds)) == (1, 1)
    assert accounts.get_account("u1") == before
    assert redis_client.llen(queues.NORMAL) == 1
    assert slots(redis_client, "u1") == [kept] and redis_client.zcard(keys.ADMITTED_UNSENT) == 0


def test_insufficient_credits_write_nothing_and_give_the_slot_back(store, redis_client, limits):
    limits(default_balance_credits=30)
    kept = submit_run("u1", "buy headphones")  # holds 20 of 30
    with pytest.raises(InsufficientCredits) as refused:
        submit_run("u1", "buy a lamp")
    assert (refused.value.needed, refused.value.available) == (20, 10)
    with pytest.raises(InsufficientCredits):
        submit_run("u2", "a laptop", kind="large")  # a new user: 30 < 60
    assert (count(run_checkpoints), count(run_holds), count(user_accounts)) == (1, 1, 1)
    assert accounts.get_account("u1").held_credits == 20
    assert redis_client.llen(queues.NORMAL) + redis_client.llen(queues.LARGE) == 1
    assert slots(redis_client, "u1") == [kept] and slots(redis_client, "u2") == []
    assert redis_client.zcard(keys.ADMITTED_UNSENT) == 0


def test_submit_releases_the_slot_on_bad_input(mysql_store, redis_client):
    from fenced_core.errors import InvalidRequest

    with pytest.raises(InvalidRequest):
        submit_run("u1", "q", kind="huge")
    assert slots(redis_client, "u1") == [] and redis_client.zcard(keys.ADMITTED_UNSENT) == 0
    assert count(run_checkpoints) == 0


# -- fairness ---------------------------------------------------------------------------------------
def test_promoter_moves_the_oldest_large_run_to_the_front(mysql_store, redis_client):
    normal = [submit_run(f"u{i}", "buy headphones") for i in range(3)]  # no worker: they wait
    large = [submit_run(f"v{i}", "a laptop", kind="large") for i in range(3)]
    before = [run_id_of(m) for m in redis_client.lrange(queues.NORMAL, 0, -1)]
    assert before == list(reversed(normal)), "kombu LPUSHes: the oldest is at the right end"

    assert promote_large(queues.LARGE, queues.NORMAL, 60_000, force=True) == large[0]
    after = [run_id_of(m) for m in redis_client.lrange(queues.NORMAL, 0, -1)]
    assert after == [*before, large[0]], "the oldest large run is next at the consuming (right) end"
    assert [run_id_of(m) for m in redis_client.lrange(queues.LARGE, 0, -1)] == [large[2], large[1]]
    message = json.loads(redis_client.lindex(queues.NORMAL, -1))
    assert message["headers"]["id"] == large[0], "the message is moved whole"
    assert any(e.kind == "promoted" for e in ledger.history(large[0]))

    # One promotion per interval across workers: the lock holds the next caller off.
    assert promote_large(queues.LARGE, queues.NORMAL, 60_000) == large[1]
    assert promote_large(queues.LARGE, queues.NORMAL, 60_000) is None
    assert [run_id_of(m) for m in redis_client.lrange(queues.LARGE, 0, -1)] == [large[2]]


def test_promoter_leaves_large_runs_alone_without_a_normal_backlog(mysql_store, redis_client):
    large = submit_run("v1", "a laptop", kind="large")
    assert promote_large(queues.LARGE, queues.NORMAL, 60_000, force=True) is None
    assert [run_id_of(m) for m in redis_client.lrange(queues.LARGE, 0, -1)] == [large]
    assert redis_client.llen(queues.NORMAL) == 0


@pytest.mark.chaos
def test_large_run_is_not_starved_behind_a_normal_backlog(workers):
    normal = [submit_run(f"u{i}", "buy headphones") for i in range(24)]
    large = submit_run("big", "a laptop", kind="large")
    workers.start("a", concurrency=2, FENCED_STUB_STEP_MS="100", FENCED_LARGE_PROMOTE_EVERY_MS="300")
    wait_terminal([large], timeout=25)
    started = first_claim_ms(large)
    assert started is not None
    later = [r for r in normal if (first_claim_ms(r) or 2**62) > started]
    assert len(later) >= 10, f"the large run started after {24 - len(later)} of 24 normal runs: starved"
    assert any(e.kind == "promoted" for e in ledger.history(large))
    wait_terminal(normal, timeout=30)


# -- slots come back when runs end (needs release_slot called at terminal writes) -------------------------

@pytest.mark.chaos
def test_slots_come_back_when_runs_end(workers, limits):
    limits(max_runs_per_user=3)
    workers.start("a", FENCED_STUB_STEP_MS="50")
    ids = [submit_run("u1", "buy headphones"), submit_run("u1", "laptop [terminal]"),
           submit_run("u1", "laptop [transient:99]")]
    ended = wait_terminal(ids, timeout=30)
    assert [r.state for r in ended] == ["done", "failed", "dead"]
    # Each slot goes back right after its run's terminal commit, which wait_terminal sees first.
    wait_for(lambda: slots(get_redis(), "u1") == [], 10, "every slot of u1 to come back")


def test_a_wakeup_for_a_finished_run_releases_its_slot(mysql_store, redis_client):
    from tasks.delivery import deliver

    run_id = submit_run("u1", "buy headphones")
    c = runs.claim(runs.get_run(run_id), "w/1")
    runs.finish(c, "done", {}, runs.Usage(), "", answer="x")  # as if its holder died right after this
    assert slots(redis_client, "u1") == [run_id]
    assert deliver(run_id, None, send_next=lambda *_: None) == "skipped"
    assert slots(redis_client, "u1") == []


def test_the_sweeper_releases_the_slot_of_an_expired_run(mysql_store, redis_client, limits):
    from fencing.sweeper import sweep

    limits(hold_expiry_s=1)
    run_id = submit_run("u1", "buy headphones")  # no worker: nobody claims it
    time.sleep(1.1)
    sweep(lambda _run_id: None, force=True)
    assert runs.get_run(run_id).state == "failed"
    assert accounts.get_account("u1").held_credits == 0
    assert slots(redis_client, "u1") == []
