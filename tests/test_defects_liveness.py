"""Issue 10, defects 1-7, 9, 10 and the ledger tightening: each test failed on the code before its fix.

Real Redis, MariaDB and SQLite; real worker processes where a worker is involved.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from checkpoints import inputs, ledger, runs
from checkpoints.db import in_txn, transaction
from checkpoints.runs import Usage
from fenced_core.errors import FencedOut, InvalidRequest
from fencing import epoch, events, faults, keys, liveness, reaper
from fencing.lease import Lease
from harness.verdict import FINAL_EVENT_GRACE_S, read_stream
from tasks import submit_run
from tests.workers_fixture import wait_for, wait_terminal


def new_run(query: str = "buy headphones", user: str = "user-1") -> runs.Run:
    run_id = runs.new_run_id()
    in_txn(runs.create_run_txn, run_id, user, "normal", query, "test")
    run = runs.get_run(run_id)
    assert run is not None
    return run


def _index_members(client: Any, run_id: str) -> list[str]:
    return [m for m in client.zrange(keys.lease_index(run_id), 0, -1) if m.split("|")[-1] == run_id]


# -- 1. a hung step ---------------------------------------------------------------------------------
HANG_ENV = {"FENCED_STEP_TIMEOUT_S": "1"}


@pytest.mark.chaos
@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_hung_step_is_taken_over_after_the_step_timeout_and_fenced_out_when_it_wakes(workers, pool):
    """Defect 1: the watchdog kept renewing a hung step's lease, so nobody ever took the run over."""
    workers.start("a", pool=pool, concurrency=2, **HANG_ENV)
    workers.start("b", pool=pool, concurrency=2, **HANG_ENV)
    faults.arm("after_model_call", action="hang", hang_s=6)
    run_id = submit_run("u1", "buy a kettle")
    hit = faults.next_hit(20)
    assert hit and hit[1] == run_id, "no step hung"
    hung_pid = hit[2]
    [run] = wait_terminal([run_id], timeout=30)
    assert run.state == "done"
    history = ledger.history(run_id)
    timeouts = [e for e in history if e.kind == "step_timeout"]
    assert len(timeouts) == 1 and timeouts[0].actor.split(":")[1] == str(hung_pid), [e.kind for e in history]
    assert any(e.kind == "takeover" for e in history)
    # The hung thread wakes after 6 s and must be refused at its next write.
    wait_for(lambda: any(e.kind == "fence_rejected" and e.actor == timeouts[0].actor
                         for e in ledger.history(run_id)), 15, "the woken thread to be fenced out")
    view = events.live_view(read_stream(run_id, "done", FINAL_EVENT_GRACE_S))  # the event follows the row
    assert [e.type for e in view].count("run_done") == 1


@pytest.mark.chaos
def test_a_step_that_hangs_at_every_delivery_is_dead_lettered(workers):
    """Defect 1 (and 4): a step hanging every time is a poison run: dead after max_deliveries, and its
    stream ends with run_dead."""
    workers.start("a", concurrency=3, **HANG_ENV)
    workers.start("b", concurrency=3, **HANG_ENV)
    faults.arm("after_model_call", times=10, action="hang", hang_s=60)
    run_id = submit_run("u1", "buy a toaster")
    [run] = wait_terminal([run_id], timeout=45)
    assert run.state == "dead", run.error
    assert "claimed 3 times" in (run.error or "")
    assert sum(e.kind == "step_timeout" for e in ledger.history(run_id)) == 3
    assert read_stream(run_id, "dead", FINAL_EVENT_GRACE_S)[-1].type == "run_dead", (
        "every terminal state ends the stream")


# -- 2. waiting on a person is no failed delivery ---------------------------------------------------
def test_parking_and_answering_do_not_use_up_the_crash_budget(store):
    """Defect 2: three questions in one step counted as three failed deliveries: dead-lettered."""
    run = new_run()
    for turn in range(4):
        c = runs.claim(run, f"w/{turn}")
        assert c is not None and c.deliveries == 1, f"claim {turn} after a reply counts as a first delivery"
        inputs.ask(c, f"call-{turn}", 0, f"question {turn}?")
        runs.park(c, f"question {turn}?", {}, Usage(), "")
        inputs.reply(run.run_id, f"answer {turn}", "user-1")


# -- 4. every terminal state has its final event, and the repair knows them all ---------------------
def test_the_repair_path_knows_every_terminal_state():
    from tasks.step import FINAL_EVENTS

    assert set(FINAL_EVENTS) == {"done", "failed", "dead", "cancelled"}


# -- 5. fast takeover never waits for an old rescue marker ------------------------------------------
def test_a_holder_that_dies_soon_after_its_own_rescue_is_rescued_at_once(redis_client, settings_env):
    """Defect 5: the rescue marker of the rescue that woke this holder blocked the fast path's rescue,
    leaving the run with no lease, no index entry and no message until the sweeper."""
    settings_env(fast_takeover=1, lease_ttl_ms=30_000)
    from fencing.connection import process_token

    sent: list[str] = []
    assert reaper.rescue("r5", 30_000, "lease expired", sent.append)
    holder = Lease("r5", 30_000)
    assert holder.acquire(None), "the rescued delivery takes the lease"
    assert liveness.presume_dead(process_token(), sent.append) == ["r5"]
    assert sent == ["r5", "r5"], "the dead holder's run must get a fresh wake-up now"
    # Child death, the prefork path, likewise.
    again = Lease("r5", 30_000)
    assert again.acquire(None)
    import os
    import socket

    assert liveness.child_died("r5", os.getpid(), sent.append)
    assert socket.gethostname() and sent == ["r5"] * 3
    assert _index_members(redis_client, "r5") == ["rescue|r5"], "dead holders unwatched; the rescue watched"


def test_a_rescue_no_delivery_answers_is_sent_again(redis_client):
    """A rescue message swallowed by a worker that froze holding it (or lost) left the run to the
    sweeper once its marker expired; the rescue is watched in the lease index like a lease."""
    sent: list[str] = []
    assert reaper.rescue("rs", 300, "lease expired", sent.append)
    assert reaper.reap(sent.append, 300) == [], "not before the grace"
    time.sleep(0.35)
    assert reaper.reap(sent.append, 300) == ["rs"] and sent == ["rs", "rs"]
    answered: list[str] = []
    assert reaper.rescue("ra", 300, "lease expired", answered.append)
    assert Lease("ra", 30_000).acquire(None), "a delivery takes the run"
    time.sleep(0.35)
    assert "ra" not in reaper.reap(answered.append, 300)
    assert answered.count("ra") == 1, "the answered rescue is not sent again"


def test_a_run_whose_entry_is_popped_while_another_rescue_is_out_stays_watched(redis_client):
    """The reaper pops an expired holder's entry, then finds a rescue marker out: that rescue's index
    entry was the run's only other watcher, and a rescuer that dies between its marker and its entry
    leaves none. The run then had no lease, no entry and no message until the sweeper (a grace later);
    now the blocked rescue re-adds the rescue entry, due when the marker expires."""
    holder = Lease("rb", 300)
    assert holder.acquire(None)
    redis_client.delete(keys.lease("rb"))  # the holder froze: its lease ran out
    redis_client.set(keys.rescue("rb"), "a-rescuer-that-died", px=700)  # its marker, never its entry
    time.sleep(0.35)
    sent: list[str] = []
    assert reaper.reap(sent.append, 300) == [] and sent == [], "the marker blocks a second rescue"
    assert _index_members(redis_client, "rb") == ["rescue|rb"], "popped, the run must stay watched"
    due = redis_client.zscore(keys.lease_index("rb"), "rescue|rb")
    assert 0 < due - time.time() * 1000 <= 700, "due when the marker expires, not later"
    time.sleep(0.45)
    assert reaper.reap(sent.append, 300) == ["rb"] and sent == ["rb"], "rescued once the marker expired"


def test_a_late_hang_takeover_says_what_watched_the_run(redis_client):
    """`fenced chaos` notes, for a hang takeover past its bound, the run's lease, marker and index
    entries at the bound (a miss with nothing to read was once left unexplained)."""
    from chaos.harness import watch_state

    assert watch_state("rw").endswith("index entries: none") and "lease None (-2 ms left)" in watch_state("rw")
    holder = Lease("rw", 5000)
    assert holder.acquire(None)
    redis_client.set(keys.rescue("rw"), "someone", px=9000)
    said = watch_state("rw")
    assert f"lease {holder.token!r}" in said and "rescue marker 'someone'" in said
    assert f"{holder.member} due in" in said


def test_a_process_presumed_dead_with_300_leases_is_rescued_in_a_fixed_number_of_round_trips(
        mysql_store, redis_client, settings_env):
    """Issue 17: under the 1,000-run load one killed worker held ~500 runs, rescued one by one (six round
    trips and a commit each: 1.7 s before the last wake-up went out). Now: every lease released, every run
    watched before its wake-up is sent, each rescue in the ledger, in round trips that do not grow with the
    runs; and a run another holder has meanwhile is left alone."""
    from bench.breakdown import round_trips
    from fencing.connection import process_token

    settings_env(fast_takeover=1, lease_ttl_ms=30_000)
    dead = f"{process_token()}-dead"
    ids = [f"held-{i:03d}" for i in range(300)]
    from fencing.connection import get_redis

    pipe = get_redis().pipeline(transaction=False)
    for run_id in ids:
        pipe.set(keys.lease(run_id), f"{dead}/{run_id}", px=30_000)
        pipe.zadd(keys.lease_index(run_id), {keys.index_member(run_id, f"{dead}/{run_id}"): 2**40})
    pipe.sadd(keys.held_by(dead), *ids, "taken-over")
    pipe.set(keys.lease("taken-over"), "someone-alive/1", px=30_000)
    pipe.execute()
    watched_when_sent: list[bool] = []
    counted: dict[str, int] = {}

    def send(run_id: str) -> None:
        members = _index_members(redis_client, run_id)
        counted["redis"] -= 1  # this check's own round trip
        watched_when_sent.append(members == [f"rescue|{run_id}"])

    with round_trips() as trips:
        counted = trips
        rescued = liveness.presume_dead(dead, send)
    assert rescued == ids and watched_when_sent == [True] * 300, "each run watched (only) before its wake-up"
    assert trips["redis"] <= 8 and trips["sql"] <= 3, trips
    assert not any(redis_client.exists(keys.lease(r)) for r in ids)
    assert redis_client.get(keys.lease("taken-over")) == "someone-alive/1"
    with transaction(readonly=True) as conn:
        import sqlalchemy as sa

        from checkpoints.schema import run_ledger

        rows = conn.execute(sa.select(run_ledger.c.run_id, run_ledger.c.kind, run_ledger.c.reason)
                            .where(run_ledger.c.kind == "rescue")).all()
    assert sorted(r.run_id for r in rows) == ids and all("presumed dead" in r.reason for r in rows)


# -- 6. park lets go of the lease before `waiting` commits ------------------------------------------
class _AskModel:
    def decide(self, ctx: Any) -> Any:
        from fenced_agents.model import Decision, ToolCall

        if ctx.step == 0 and not ctx.replies:
            return Decision("ask", "asking", [ToolCall("call-ask", "ask_user", {"question": "Size?"})],
                            prompt_tokens=3, completion_tokens=1)
        return Decision("done", "ok", [], final=True, answer="ok", prompt_tokens=3, completion_tokens=1)


def test_a_reply_landing_right_after_the_park_is_not_dropped(store, monkeypatch):
    """Defect 6: park committed `waiting` while the lease was held; a reply and its wake-up in that
    window were dropped as duplicates. The lease must be free when `waiting` commits, and run_waiting
    comes after the commit."""
    from fenced_core.settings import get_settings
    from fencing.connection import get_redis
    from tasks.delivery import deliver
    from tasks.step import StepRunner

    run = new_run()
    lease = Lease(run.run_id, get_settings().lease_ttl_ms)
    assert lease.acquire(0)
    c = runs.claim(run, lease.token)
    seen: dict[str, Any] = {}
    park = runs.park

    def observing_park(*args: Any, **kwargs: Any) -> None:
        seen["lease_at_park"] = get_redis().get(lease.key)
        seen["events_at_park"] = [e.type for e in events.read(run.run_id)]
        park(*args, **kwargs)

    monkeypatch.setattr(runs, "park", observing_park)
    from fenced import Agent
    from tasks import programs

    # This run's program, for the test: an agent whose model asks at step 0 (ask_user is built in).
    monkeypatch.setitem(programs._programs, run.agent, Agent("ask-first", model=_AskModel()))
    assert StepRunner(c, lease).run_step().state == "waiting"
    assert seen["lease_at_park"] is None, "the lease must be let go before `waiting` commits"
    assert "run_waiting" not in seen["events_at_park"], "run_waiting only after the commit"
    assert events.read(run.run_id)[-1].type == "run_waiting"
    inputs.reply(run.run_id, "size 42", "user-1")
    sent: list[tuple[str, int]] = []
    assert deliver(run.run_id, 0, lambda r, s: sent.append((r, s))) == "continue", "the reply's wake-up must run"


# -- 7. a fenced-out holder never removes its successor's index entry -------------------------------
def test_a_fenced_out_holders_release_leaves_the_new_holders_index_entry(redis_client):
    old = Lease("r7", 2000)
    assert old.acquire(0)
    redis_client.delete(old.key)  # expired while the old holder was frozen
    new = Lease("r7", 2000)
    assert new.acquire(0)
    assert not old.release(None), "not the old holder's lease any more"
    assert len(_index_members(redis_client, "r7")) == 1, "the new holder must stay watched"


def test_a_refused_acquire_does_not_push_the_holders_deadline_out(redis_client):
    holder = Lease("r7b", 2000)
    assert holder.acquire(0)
    [member] = _index_members(redis_client, "r7b")
    deadline = redis_client.zscore(keys.lease_index("r7b"), member)
    later = Lease("r7b", 60_000)
    assert not later.acquire(0)
    assert _index_members(redis_client, "r7b") == [member], "the refused acquire leaves no entry"
    assert redis_client.zscore(keys.lease_index("r7b"), member) == deadline, "the holder's deadline is unchanged"


def test_a_duplicate_wake_up_on_the_holders_own_process_keeps_the_run_in_fast_takeovers_view(
        redis_client, settings_env):
    """Found under load (issue 17, 2026-12-02): a duplicate wake-up delivered to the process that holds
    the run through another delivery was refused, and the refusal took the run out of the process's set;
    the process died 1.6 s later, before its watchdog put it back, and fast takeover missed 21 runs: they
    waited the whole 30 s lease. A refusal by a lease another process holds still leaves no stale entry."""
    settings_env(fast_takeover=1, lease_ttl_ms=30_000)
    from fencing.connection import process_token

    holder = Lease("r-dup", 30_000)
    assert holder.acquire(None)
    duplicate = Lease("r-dup", 30_000)  # another delivery of this same process
    assert not duplicate.acquire(7)
    assert redis_client.sismember(keys.held_by(process_token()), "r-dup"), "the holder's process still holds it"
    sent: list[str] = []
    assert liveness.presume_dead(process_token(), sent.append) == ["r-dup"] and sent == ["r-dup"]

    redis_client.set(keys.lease("r-other"), "other-host:1:abc/def", px=30_000)
    assert not Lease("r-other", 30_000).acquire(None)
    assert not redis_client.sismember(keys.held_by(process_token()), "r-other"), "no entry for what it never held"


# -- 9. a retried park cannot overwrite a reply ------------------------------------------------------
def test_a_retried_park_after_a_reply_is_refused(store):
    run = new_run()
    c = runs.claim(run, "w/1")
    inputs.ask(c, "call-1", 0, "colour?")
    runs.park(c, "colour?", {}, Usage(), "")
    inputs.reply(run.run_id, "red", "user-1")
    with pytest.raises(FencedOut):
        runs.park(c, "colour?", {}, Usage(), "")  # the retry of a park whose commit reply was lost
    assert runs.get_run(run.run_id).state == "queued", "the reply stands"


def test_a_waiting_run_whose_question_is_answered_is_found(store):
    from checkpoints.schema import run_checkpoints

    run = new_run()
    c = runs.claim(run, "w/1")
    inputs.ask(c, "call-1", 0, "colour?")
    runs.park(c, "colour?", {}, Usage(), "")
    inputs.reply(run.run_id, "red", "user-1")
    with transaction() as conn:  # as the old code left it: waiting, with its question answered
        conn.execute(run_checkpoints.update().where(run_checkpoints.c.run_id == run.run_id).values(state="waiting"))
    assert in_txn(inputs.requeue_answered_txn, "sweeper") == [run.run_id]
    assert runs.get_run(run.run_id).state == "queued"
    assert in_txn(inputs.requeue_answered_txn, "sweeper") == []


# -- 10. submit returns the run whenever it exists; idempotency keys ---------------------------------
def test_submit_returns_the_run_even_when_a_worker_claimed_it_first(mysql_store, monkeypatch):
    """Defect 10: FencedOut (a BaseException) escaped submit_run when a worker's claim raised the epoch
    mirror before the submitter appended run_queued: the caller saw an error for a run that exists."""
    fixed = runs.new_run_id()
    monkeypatch.setattr(runs, "new_run_id", lambda: fixed)
    epoch.raise_epoch(fixed, 1)  # the claim's mirror, raised before the submitter's first event
    assert submit_run("u10", "buy a lamp") == fixed
    assert runs.get_run(fixed) is not None


def test_a_submit_retried_after_its_commit_landed_creates_nothing_new(store):
    from tasks.submit import _create_once_txn

    run_id = runs.new_run_id()
    assert in_txn(_create_once_txn, run_id, "u10", "normal", "buy a lamp", "shopping", "") == 20
    assert in_txn(_create_once_txn, run_id, "u10", "normal", "buy a lamp", "shopping", "") == 20, \
        "a retry is no error"
    from checkpoints.accounts import get_account

    assert get_account("u10").held_credits == 20, "one hold"


def test_an_idempotency_key_returns_the_same_run(mysql_store):
    first = submit_run("u11", "buy socks", idempotency_key="order-7")
    assert submit_run("u11", "buy socks", idempotency_key="order-7") == first
    assert submit_run("u12", "buy socks", idempotency_key="order-7") != first, "keys are per user"
    with pytest.raises(InvalidRequest, match="idempotency key"):
        submit_run("u11", "buy shoes", idempotency_key="order-7")
    from checkpoints.accounts import get_account

    assert get_account("u11").held_credits == 20


# -- ledger rows of a fenced-out holder --------------------------------------------------------------
def test_a_fenced_out_holders_retry_record_is_refused(store):
    run = new_run()
    old = runs.claim(run, "old/1")
    runs.claim(run, "new/1")
    with pytest.raises(FencedOut):
        runs.record_fenced(old, "retry", "model failed transiently")
    assert "retry" not in [e.kind for e in ledger.history(run.run_id)]


# -- the sweeper reaches every stranded run ----------------------------------------------------------
def test_the_sweeper_finds_a_stranded_run_behind_500_hung_ones(mysql_store, redis_client, settings_env):
    """Tightening: the sweeper read only the 500 oldest candidates, so runs with live leases (hung)
    hid a stranded run behind them forever."""
    import sqlalchemy as sa

    from checkpoints.schema import run_checkpoints
    from fencing import sweeper

    settings_env(sweeper_grace_ms=1000)
    old = runs.now_ms() - 60_000
    hung = [f"hung-{i:04d}" for i in range(501)]
    base = dict(user_id="u", kind="normal", query="q", state="running", epoch=1, owner="x:1:y/z", step=0,
                phase="none", checkpoint=None, prompt_tokens=0, completion_tokens=0, model_calls=0,
                last_event_id="", deliveries=1, total_deliveries=1, created_at_ms=old)
    with transaction() as conn:
        conn.execute(sa.insert(run_checkpoints), [{**base, "run_id": r, "updated_at_ms": old} for r in hung])
        conn.execute(sa.insert(run_checkpoints), [{**base, "run_id": "stranded", "updated_at_ms": old + 1000}])
    pipe = redis_client.pipeline(transaction=False)
    for r in hung:
        pipe.set(keys.lease(r), "x:1:y/z", px=60_000)
    pipe.execute()
    sent: list[str] = []
    assert sweeper.sweep(sent.append, force=True) == ["stranded"] == sent


def test_the_sweeper_wakes_a_run_left_waiting_on_an_answered_question(mysql_store, settings_env):
    from checkpoints.schema import run_checkpoints
    from fencing import sweeper

    settings_env(sweeper_grace_ms=1)
    run = new_run()
    c = runs.claim(run, "w/1")
    inputs.ask(c, "call-1", 0, "colour?")
    runs.park(c, "colour?", {}, Usage(), "")
    inputs.reply(run.run_id, "red", "user-1")
    with transaction() as conn:  # as a retried park left it before the fix
        conn.execute(run_checkpoints.update().where(run_checkpoints.c.run_id == run.run_id)
                     .values(state="waiting", updated_at_ms=runs.now_ms() - 10_000))
    sent: list[str] = []
    assert sweeper.sweep(sent.append, force=True) == [run.run_id]
    assert runs.get_run(run.run_id).state == "queued"
    assert "requeued" in [e.kind for e in ledger.history(run.run_id)]


def test_an_expired_run_ends_its_stream(mysql_store, settings_env):
    """Defect 4: every terminal state ends the stream, an expired run (never claimed) too."""
    from fencing import sweeper

    settings_env(hold_expiry_s=1)
    run_id = submit_run("u4", "buy a mug")
    runs_before = runs.get_run(run_id)
    assert runs_before is not None and runs_before.state == "queued"
    with transaction() as conn:
        from checkpoints.schema import run_holds

        conn.execute(run_holds.update().where(run_holds.c.run_id == run_id).values(expires_at_ms=1))
    sweeper.sweep(lambda _r: None, force=True)
    assert runs.get_run(run_id).error_class == "expired"
    assert events.read(run_id)[-1].type == "run_failed"


# -- 8. embedded SQLite: a frozen writer costs a bounded wait, and its death frees everyone ------------
def test_a_frozen_sqlite_writer_costs_a_bounded_wait_and_its_death_frees_the_store(tmp_path, settings_env):
    """Defect 8: a process stopped inside a write transaction holds SQLite's database-wide write lock.
    A write waiting on it must fail within sqlite_busy_timeout_ms (transient: retried), not sit in
    the driver for 30 s, and every write goes through again once the frozen process dies."""
    import os
    import subprocess
    import sys
    import time

    import sqlalchemy as sa

    from checkpoints.db import dispose_all, migrate, transaction
    from checkpoints.schema import run_ledger

    url = f"sqlite:///{tmp_path / 'embedded.db'}"
    settings_env(db_url=url, sqlite_busy_timeout_ms=1000)
    dispose_all()
    migrate(url)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import os, signal, sqlite3; c = sqlite3.connect({!r}, isolation_level=None); "
        "c.execute('BEGIN IMMEDIATE'); c.execute(\"DELETE FROM run_ledger WHERE run_id = 'x'\"); "
        "print('locked', flush=True); os.kill(os.getpid(), signal.SIGSTOP)").format(str(tmp_path / "embedded.db"))],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        with pytest.raises(sa.exc.OperationalError, match="locked"), transaction(url) as conn:
            conn.execute(run_ledger.insert().values(run_id="r8", at_ms=1, epoch=0, actor="t", kind="k", reason="r"))
        waited = time.monotonic() - started
        assert waited < 10, f"a write waited {waited:.1f} s on a frozen writer"
    finally:
        os.kill(holder.pid, 9)
        holder.wait()
    with transaction(url) as conn:  # the frozen writer died: the OS freed its lock
        conn.execute(run_ledger.insert().values(run_id="r8", at_ms=1, epoch=0, actor="t", kind="k", reason="r"))
    dispose_all()


def test_a_rescue_of_a_finished_run_is_answered_once_not_sent_forever(store, redis_client):
    """A wake-up that finds the run ended answers the rescue: the reaper must not rescue it again."""
    from tasks.delivery import deliver

    run = new_run()
    c = runs.claim(run, "w/1")
    runs.finish(c, "done", {}, Usage(), "", answer="ok")
    sent: list[str] = []
    assert reaper.rescue(run.run_id, 300, "lease expired", sent.append)
    assert deliver(run.run_id, None, lambda _r, _s: None) == "skipped"
    time.sleep(0.35)
    assert run.run_id not in reaper.reap(sent.append, 300) and sent == [run.run_id]
