"""Crashes, freezes and wipes against real worker processes, real Redis and real MariaDB."""

from __future__ import annotations

import os
import signal
import time

import pytest

from checkpoints import ledger, runs
from checkpoints.db import in_txn
from fencing import events, faults, keys
from fencing.connection import get_redis
from harness.verdict import check_run
from tasks import submit_run
from tests.workers_fixture import wait_for, wait_terminal, wait_zombie_refused

pytestmark = pytest.mark.chaos


def test_runs_finish_on_a_healthy_pool(workers):
    workers.start("a")
    ids = [submit_run("u1", "buy headphones"), submit_run("u2", "a laptop", kind="large")]
    wait_terminal(ids, timeout=30)
    for run_id in ids:
        v = check_run(run_id)
        assert v.ok, v.failures
        assert v.takeovers == 0 and v.resumed_events == 0
    assert check_run(ids[1]).credits_charged > check_run(ids[0]).credits_charged, "large runs cost more"


def _kill_at(workers, point: str, query: str = "buy running shoes") -> tuple[str, str]:
    """Arm `point`, submit a run, SIGKILL the whole process group of the worker that reached it."""
    faults.arm(point)
    run_id = submit_run("u1", query)
    hit = faults.next_hit(30)
    assert hit, f"no worker reached {point}"
    _, hit_run, pid = hit
    assert hit_run == run_id
    victim = workers.by_pid(pid)
    victim.kill(signal.SIGKILL)
    return run_id, victim.name


@pytest.mark.parametrize("point", ["after_model_call", "after_tools"])
def test_sigkill_mid_step_resumes_once(workers, point):
    workers.start("a")
    workers.start("b")
    run_id, _victim = _kill_at(workers, point)
    [run] = wait_terminal([run_id], timeout=40)
    v = check_run(run_id)
    assert v.ok, v.failures
    assert v.takeovers == 1 and v.resumed_events == 1
    resumed = next(e for e in events.read(run_id) if e.type == "task_resumed")
    # The armed point fires on the run's first step: before checkpoint A (phase none) or after it.
    assert resumed.data["phase"] == ("none" if point == "after_model_call" else "decided")
    assert (run.model_calls, v.credits_charged) == (4, 16), "charged exactly like an unkilled run"
    assert resumed.data["previous_owner"].split(":")[1] != "", "task_resumed names the dead holder"
    if point == "after_tools":
        # Resumed from checkpoint A: the decision was replayed, the model not called again.
        assert any(e.kind == "takeover" and "decided" in e.reason for e in ledger.history(run_id))


def test_sigkill_after_terminal_write_leaves_nothing_to_rescue(workers):
    """The ending's one round trip gave the slot and the lease back with the final event (tasks.endings):
    a holder killed after it holds nothing, and nothing is rescued, even after its lease would have run out."""
    run_id, _run = _killed_after_its_terminal_write(workers, "after_terminal_write")
    r = get_redis()
    assert r.get(keys.lease(run_id)) is None, "let go with the final event"
    assert [m for m in r.zrange(keys.lease_index(run_id), 0, -1) if m.endswith(f"|{run_id}")] == []
    time.sleep(2 * 2.0 + 1)  # twice the tests' lease (conftest: 2,000 ms) and a reaper tick
    assert [e.kind for e in ledger.history(run_id)].count("rescue") == 0, "nothing was left to rescue"
    _judged_ended_once(run_id)


def test_sigkill_between_the_terminal_write_and_its_ending_is_repaired(workers):
    """Killed after the terminal commit, before the round trip that gives back the slot and the lease and
    says the final event: the dead holder's lease brings a rescue, whose delivery finds the run ended and
    repairs both (tasks.endings.repair)."""
    run_id, run = _killed_after_its_terminal_write(workers, "before_ending")
    r = get_redis()
    assert r.zrange(keys.user_slots("u1"), 0, -1) == [run_id], "the slot is still held"
    assert events.newest_eid(run_id) != "run:done"
    wait_for(lambda: any(e.kind == "rescue" for e in ledger.history(run_id)), 15, "the rescue of the dead lease")
    wait_for(lambda: events.newest_eid(run_id) == "run:done", 15, "the final event repaired")
    assert r.zrange(keys.user_slots("u1"), 0, -1) == [], "the slot given back"
    [final] = [e for e in events.read(run_id) if e.eid == "run:done"]
    assert final.data["repaired"] is True and final.data["answer"] == run.answer
    _judged_ended_once(run_id)


def _killed_after_its_terminal_write(workers, point: str) -> tuple[str, runs.Run]:
    """Two workers; the one whose run reaches `point` (after its terminal commit) is killed there."""
    workers.start("a")
    workers.start("b")
    run_id, _ = _kill_at(workers, point)
    run = runs.get_run(run_id)
    assert run is not None and run.state == "done"
    return run_id, run


def _judged_ended_once(run_id: str) -> None:
    v = check_run(run_id)
    assert v.ok, v.failures
    assert [e.kind for e in ledger.history(run_id)].count("done") == 1
    assert v.resumed_events == 0


def test_prefork_pool_child_killed_mid_step(workers):
    """OOM-style: only the pool child holding the step dies; its parent releases the lease and rescues the
    run at once (fencing.liveness.child_died), long before the lease would run out."""
    a = workers.start("a", pool="prefork", concurrency=2, FENCED_LEASE_TTL_MS="6000", FENCED_HEARTBEAT_MS="1500")
    faults.arm("after_tools")
    run_id = submit_run("u1", "buy a backpack")
    hit = faults.next_hit(30)
    assert hit and hit[1] == run_id, hit
    child = hit[2]
    assert child != a.pid and workers.by_pid(child) is a, "the step runs in a pool child of a"
    killed_ms = time.time() * 1000
    os.kill(child, signal.SIGKILL)  # the child alone, not the process group
    [run] = wait_terminal([run_id], timeout=40)
    assert a.alive, "the parent outlived its child"
    assert run.state == "done"
    rescues = [e.reason for e in ledger.history(run_id) if e.kind == "rescue"]
    assert any(r.startswith(f"pool child {child} died") for r in rescues), rescues
    v = check_run(run_id)
    assert v.ok, v.failures
    assert v.takeovers == 1 and v.resumed_events == 1
    resumed = next(e for e in get_redis().xrange(keys.events(run_id)) if e[1]["type"] == "task_resumed")
    took_ms = int(resumed[0].split("-")[0]) - killed_ms
    assert took_ms < 3000, f"taken over {took_ms:.0f} ms after the kill: the 6 s lease was waited for"


def test_zombie_is_fenced_out_after_sigcont(workers):
    slow = {"FENCED_STUB_STEP_MS": "1500"}
    a = workers.start("a", **slow)
    run_id = submit_run("u1", "buy a keyboard")
    holder = wait_for(lambda: workers.holder_of(run_id), 20, "a holder")
    assert holder is a
    workers.start("b", **slow)
    a.kill(signal.SIGSTOP)
    try:
        wait_terminal([run_id], timeout=60)
    finally:
        a.kill(signal.SIGCONT)
    wait_zombie_refused(run_id, a)
    time.sleep(1)
    v = check_run(run_id)
    assert v.ok, v.failures
    assert v.takeovers >= 1


def test_redis_wipe_mid_flight_every_run_finishes(workers):
    workers.start("a")
    workers.start("b")
    ids = [submit_run(f"u{i}", q) for i, q in enumerate(
        ["buy headphones", "a laptop", "buy a desk lamp", "compare monitors", "buy an umbrella", "blender"])]
    wait_for(lambda: sum(1 for r in ids if (runs.get_run(r).step or 0) >= 1) >= 3, 30, "runs in flight")
    get_redis().flushall()
    wait_terminal(ids, timeout=60)
    for run_id in ids:
        v = check_run(run_id, check_events=False)
        assert v.ok, (run_id, v.failures)


def test_sweeper_sends_a_wakeup_lost_after_commit(workers):
    workers.start("a")
    run_id = runs.new_run_id()
    in_txn(runs.create_run_txn, run_id, "u1", "normal", "buy a water bottle", "api-that-crashed")
    [run] = wait_terminal([run_id], timeout=30)
    assert run.state == "done"
    assert any(e.kind == "rescue" and "no lease" in e.reason for e in ledger.history(run_id))


def test_transient_failures_retry_with_backoff_then_finish(workers):
    workers.start("a")
    run_id = submit_run("u1", "buy headphones [transient:2]")
    wait_terminal([run_id], timeout=40)
    v = check_run(run_id)
    assert v.ok, v.failures
    retries = [e for e in ledger.history(run_id) if e.kind == "retry"]
    assert len(retries) == 2 * 4, "two retries for each of the four model calls"
    assert all(e.detail["class"] == "transient" for e in retries)


def test_terminal_failure_fails_and_settles_what_was_used(workers):
    workers.start("a")
    run_id = submit_run("u1", "laptop [terminal]")
    [run] = wait_terminal([run_id], timeout=30)
    assert (run.state, run.error_class) == ("failed", "terminal")
    v = check_run(run_id)
    assert v.holds == ["settled"] and v.credits_charged == 4, "one model call's usage (800 tokens) is charged"


def test_retries_exhausted_goes_to_dead_letters(workers):
    workers.start("a", FENCED_RETRY_BUDGET="2")
    run_id = submit_run("u1", "laptop [transient:99]")
    [run] = wait_terminal([run_id], timeout=30)
    assert run.state == "dead"
    entries = get_redis().xrange(keys.DEAD_LETTERS)
    assert [e[1]["run_id"] for e in entries] == [run_id]


def test_poison_run_is_dead_lettered_after_three_deliveries(workers):
    workers.start("a", pool="prefork", concurrency=2)
    poison = submit_run("u1", "buy [poison] headphones")
    fine = [submit_run("u2", "buy a blender"), submit_run("u3", "monitor")]
    [dead, *_others] = wait_terminal([poison, *fine], timeout=60)
    assert dead.state == "dead"
    claims = [e for e in ledger.history(poison) if e.kind in ("claimed", "takeover")]
    # Step 0 claimed once and finished; step 1 claimed three times, each crashing; the fourth claim of
    # step 1 dead-letters without running it.
    assert len(claims) == 5, [e.reason for e in claims]
    assert "3 times" in dead.error
    for run_id in fine:
        v = check_run(run_id)
        assert v.ok, v.failures


def test_a_holder_killed_between_terminal_commit_and_final_event_gets_its_event_repaired(workers):
    """The row says done but the stream lacks run_done: the rescue's delivery writes it, once."""
    workers.start("a")
    run_id = submit_run("u1", "buy headphones")
    wait_terminal([run_id], timeout=30)
    client = get_redis()
    [(done_id, _)] = [(sid, f) for sid, f in client.xrange(keys.events(run_id)) if f["type"] == "run_done"]
    client.xdel(keys.events(run_id), done_id)  # as if the holder died right after its commit
    assert check_run(run_id).failed.get("stream"), "the verdict must notice the missing final event"
    from tasks.app import send_rescue

    send_rescue(run_id)
    wait_for(lambda: check_run(run_id).ok, 15, "the final event to be repaired")
    assert sum(e.type == "run_done" for e in events.read(run_id)) == 1
