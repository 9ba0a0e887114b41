"""Admission slots follow run state, not age (issue 10, defect 17): the sweeper keeps the slot of every
queued/running/waiting run (re-adding it after a Redis wipe) and frees slots whose run ended or never
existed. Real Redis, MariaDB and SQLite."""

from __future__ import annotations

import pytest

from checkpoints import inputs, lifecycle, occupancy, runs
from fenced_core.errors import AdmissionRefused
from fencing import admission, keys
from fencing.lease import now_ms
from fencing.sweeper import sweep
from tasks import queues, submit_run

QUEUES = (queues.NORMAL, queues.LARGE)


def slots(client, user_id: str) -> set[str]:
    return set(client.zrange(keys.user_slots(user_id), 0, -1))


def age(client, user_id: str, run_id: str, ms: int) -> None:
    """Make a slot look `ms` old (admitted, or last confirmed, that long ago)."""
    client.zadd(keys.user_slots(user_id), {run_id: now_ms() - ms})


def claimed(user_id: str) -> runs.Claim:
    c = runs.claim(runs.get_run(submit_run(user_id, "buy a lamp")), "w/1")
    assert c is not None
    return c


def waiting(user_id: str) -> str:
    c = claimed(user_id)
    inputs.ask(c, "call-1", 1, "which brand?")
    runs.park(c, "which brand?", {}, runs.Usage(), "")
    assert runs.get_run(c.run.run_id).state == "waiting"
    return c.run.run_id


def no_send(_run_id: str) -> None:
    pass


@pytest.mark.parametrize("state", ["queued", "waiting"])
def test_a_live_run_keeps_its_slot_past_the_ttl(store, redis_client, settings_env, state):
    """A run that waits on a person (or in the queue) longer than admission_ttl_s keeps its slot, so
    the user cannot exceed max_runs_per_user."""
    settings_env(max_runs_per_user=1, admission_ttl_s=60)
    run_id = submit_run("u1", "buy a lamp") if state == "queued" else waiting("u1")
    age(redis_client, "u1", run_id, 61_000)  # admitted more than the ttl ago ...
    sweep(no_send, force=True)  # ... with the sweeper running all along
    with pytest.raises(AdmissionRefused) as refused:
        admission.admit("second", "u1", QUEUES)
    assert refused.value.limit == "user"
    assert slots(redis_client, "u1") == {run_id}
    assert redis_client.pttl(keys.user_slots("u1")) > 55_000, "the key's expiry follows the refresh"


def test_slots_are_rebuilt_from_the_database_after_a_wipe(store, redis_client, settings_env):
    live = {submit_run("u1", "buy a lamp"), claimed("u1").run.run_id, waiting("u1")}
    other = submit_run("u2", "buy a desk")
    done = claimed("u1")
    runs.finish(done, "done", {}, runs.Usage(), "", answer="ok")
    redis_client.flushall()

    got = admission.reconcile_slots(page=2)  # pages of two: every state's rows span pages
    assert (got.live, got.restored, got.freed) == (4, 4, 0)
    assert slots(redis_client, "u1") == live and slots(redis_client, "u2") == {other}
    assert redis_client.hgetall(admission.SLOT_OWNERS) == {**{r: "u1" for r in live}, other: "u2"}
    settings_env(max_runs_per_user=3)
    with pytest.raises(AdmissionRefused):
        admission.admit("fourth", "u1", QUEUES)
    assert admission.reconcile_slots().restored == 0, "a second pass only refreshes"


def test_the_sweeper_rebuilds_slots_after_a_wipe(mysql_store, redis_client, settings_env):
    settings_env(max_runs_per_user=1)
    run_id = submit_run("u1", "buy a lamp")
    redis_client.flushall()
    admission.admit("while-wiped", "u1", QUEUES)  # today: a wipe lets the user past the limit
    admission.release_slot("u1", "while-wiped")
    sweep(no_send, force=True)
    assert slots(redis_client, "u1") == {run_id}
    with pytest.raises(AdmissionRefused):
        admission.admit("second", "u1", QUEUES)


def test_the_sweeper_frees_slots_of_ended_and_unknown_runs(store, redis_client, settings_env):
    """A release lost (Redis error, a crash after the terminal commit) or a submitter that died after
    admission: the sweep frees those slots once older than the grace; a fresh one may still be a
    submitter inside its transaction, and is kept."""
    settings_env(max_runs_per_user=10)
    grace = admission.SLOT_GRACE_MS
    ended = claimed("u1")
    runs.finish(ended, "done", {}, runs.Usage(), "", answer="ok")  # its holder died before the release
    cancelled = submit_run("u1", "buy a chair")
    lifecycle.cancel(cancelled, "u1")  # committed; no Redis follow-up ran
    live = submit_run("u1", "buy a lamp")
    admission.admit("ghost", "u1", QUEUES)  # its submitter died before creating the row
    admission.admit("newcomer", "u1", QUEUES)  # its submitter is inside its transaction
    just_ended = claimed("u1")
    runs.finish(just_ended, "failed", {}, runs.Usage(), "", error_class="terminal", error="x")
    for run_id in (ended.run.run_id, cancelled, "ghost", live):
        age(redis_client, "u1", run_id, grace + 1_000)

    sweep(no_send, force=True)
    assert slots(redis_client, "u1") == {live, "newcomer", just_ended.run.run_id}
    assert set(redis_client.hkeys(admission.SLOT_OWNERS)) == {live, "newcomer", just_ended.run.run_id}

    age(redis_client, "u1", just_ended.run.run_id, grace + 1_000)
    age(redis_client, "u1", "newcomer", grace + 1_000)
    assert admission.reconcile_slots().freed == 2
    assert slots(redis_client, "u1") == {live}


def test_a_run_that_ends_during_the_refresh_gets_no_slot_back(store, redis_client, monkeypatch):
    """The sweep read the run as live, then it ended and released its slot, then the sweep re-added it:
    the re-read after the write frees it at once, with no grace."""
    c = claimed("u1")
    run_id = c.run.run_id
    real_pages = occupancy.occupying_pages

    def pages_then_the_run_ends(page: int = 500):
        for rows in real_pages(page):
            if any(r == run_id for r, _ in rows):
                runs.finish(c, "done", {}, runs.Usage(), "", answer="ok")
                assert admission.release_slot("u1", run_id)
            yield rows

    monkeypatch.setattr(occupancy, "occupying_pages", pages_then_the_run_ends)
    got = admission.reconcile_slots()
    assert got.freed == 1
    assert slots(redis_client, "u1") == set() and redis_client.hlen(admission.SLOT_OWNERS) == 0


def test_the_age_prune_forgets_the_owner_too_and_keys_share_one_hash_tag(redis_client, settings_env):
    settings_env(max_runs_per_user=1, admission_ttl_s=60)
    admission.admit("old", "u1", QUEUES)
    assert redis_client.hget(admission.SLOT_OWNERS, "old") == "u1"
    age(redis_client, "u1", "old", 61_000)  # never confirmed live by a sweep: a leftover
    admission.admit("new", "u1", QUEUES)
    assert redis_client.hgetall(admission.SLOT_OWNERS) == {"new": "u1"}
    assert admission.release_slot("u1", "new") and redis_client.hlen(admission.SLOT_OWNERS) == 0
    for key in (admission.SLOT_OWNERS, keys.user_slots("u1"), keys.ADMITTED_UNSENT):
        assert keys.ADMISSION_TAG in key, key  # Redis Cluster: admit.lua and release touch one slot
