"""A run's whole lifecycle with real workers: cards and orders, waiting on a person, cancel, drain, dead letters."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from checkpoints import inputs, ledger, lifecycle, runs
from checkpoints.db import transaction
from examples.shopping import cards
from examples.shopping.schema import orders
from fenced_core.errors import InvalidRequest
from fencing import events, faults, keys
from fencing.connection import get_redis
from harness.history import check_history
from harness.verdict import check_run
from tasks import submit_run
from tasks.control import cancel_run, replay_dead_letter, reply_to_run
from tests.conftest import ROOT
from tests.extras import require_extra
from tests.workers_fixture import wait_for, wait_terminal

pytestmark = pytest.mark.chaos


def _order_count(card_id: str) -> int:
    with transaction(readonly=True) as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(orders).where(orders.c.card_id == card_id)).scalar()


def _confirm_cli(card_id: str, user: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fenced_cli", "confirm", card_id, "--user", user], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_double_confirm_places_one_order_even_when_a_confirmer_is_killed(workers):
    workers.start("a")
    run_id = submit_run("alice", "buy headphones")
    wait_terminal([run_id], timeout=30)
    [card] = cards.cards_for(run_id)
    # The first confirmer is killed inside its confirm transaction: its order row is inserted, the card
    # not yet marked confirmed, nothing committed.
    faults.arm("in_confirm")
    doomed = _confirm_cli(card.card_id, "alice")
    hit = faults.next_hit(30)
    assert hit == ("in_confirm", run_id, doomed.pid), hit
    doomed.kill()
    doomed.wait(10)
    assert _order_count(card.card_id) == 0, "a killed confirmer's order must roll back with its transaction"
    procs = [_confirm_cli(card.card_id, "alice") for _ in range(2)]
    printed = {p.communicate(timeout=30)[0].strip() for p in procs}
    again = cards.confirm_card(card.card_id, "alice")
    assert printed == {again.order_id}, "every confirm prints the same order number"
    assert again.reused and _order_count(card.card_id) == 1
    assert cards.get_card(card.card_id).state == "confirmed"
    assert not [v for v in check_history([run_id]) if v.condition == "orders"]


def test_someone_elses_or_an_expired_card_is_refused(workers):
    workers.start("a", FENCED_CARD_TTL_S="1")
    run_id = submit_run("alice", "buy a backpack")
    wait_terminal([run_id], timeout=30)
    [card] = cards.cards_for(run_id)
    with pytest.raises(InvalidRequest, match="another user"):
        cards.confirm_card(card.card_id, "mallory")
    wait_for(lambda: time.time() * 1000 > card.expires_at_ms, 5, "the card to expire")
    cli = _confirm_cli(card.card_id, "alice")
    _out, err = cli.communicate(timeout=30)
    assert cli.returncode == 2 and "expired" in err, err
    assert _order_count(card.card_id) == 0


def test_ask_user_parks_and_a_reply_while_no_worker_lives_is_not_lost(workers):
    a = workers.start("a")
    run_id = submit_run("bob", "buy headphones [ask]")
    run = wait_for(lambda: (r := runs.get_run(run_id)).state == "waiting" and r, 30, "the run to wait")
    assert run.owner is None and get_redis().get(keys.lease(run_id)) is None, "nobody holds a waiting run"
    [question] = inputs.for_run(run_id)
    asked_call = next(c for c in run.checkpoint["decision"]["tool_calls"] if c["name"] == "ask_user")
    assert (question.tool_call_id, question.turn, question.reply) == (asked_call["id"], 1, None)
    a.kill(signal.SIGKILL)
    reply_to_run(run_id, "Acme, please", "bob")  # no worker is alive
    assert runs.get_run(run_id).state == "queued"
    workers.start("b")
    [done] = wait_terminal([run_id], timeout=30)
    assert done.state == "done" and "Acme, please" in done.answer
    assert len(inputs.for_run(run_id)) == 1, "asked once"
    v = check_run(run_id)
    assert v.ok, v.failures
    assert sum(e.type == "run_waiting" for e in events.read(run_id)) == 1


def test_replay_after_a_crash_finds_the_reply_and_never_asks_twice(workers):
    workers.start("a")
    workers.start("b")
    run_id = submit_run("bob", "buy a desk lamp [ask]")
    wait_for(lambda: runs.get_run(run_id).state == "waiting", 30, "the run to wait")
    faults.arm("after_tools")  # the next step to finish its tools (step 1, replayed with the reply) hangs
    reply_to_run(run_id, "Globex", "bob")
    _, hit_run, pid = faults.next_hit(30)
    assert hit_run == run_id
    workers.by_pid(pid).kill(signal.SIGKILL)
    [done] = wait_terminal([run_id], timeout=40)
    assert done.state == "done" and "Globex" in done.answer
    assert len(inputs.for_run(run_id)) == 1
    assert sum(e.type == "run_waiting" for e in events.read(run_id)) == 1, "the question was not asked again"
    assert check_run(run_id).ok


def test_fixable_failure_waits_with_its_reason_then_finishes(workers):
    workers.start("a")
    run_id = submit_run("carol", "buy a blender [fixable]")
    run = wait_for(lambda: (r := runs.get_run(run_id)).state == "waiting" and r, 30, "the run to wait")
    assert run.error_class == "fixable" and "sku-999" in run.error
    reply_to_run(run_id, "the Acme blender", "carol")
    [done] = wait_terminal([run_id], timeout=30)
    assert done.state == "done"
    assert [i.kind for i in inputs.for_run(run_id)] == ["fixable"]


def test_cancel_running_run_stops_it_and_nothing_lands_after(workers):
    workers.start("a")
    # The holder is held right before its add-to-cart effect's transaction; it wakes after the cancel.
    faults.arm("before_effect", hang_s=3)
    run_id = submit_run("dan", "buy an umbrella")
    hit = faults.next_hit(30)
    assert hit and hit[1] == run_id, hit
    result = cancel_run(run_id, "dan")
    assert not result.noop and result.previous_state == "running"
    wait_for(lambda: any(e.kind == "fence_rejected" and "add_to_cart" in e.reason for e in ledger.history(run_id)),
             15, "the woken holder's add-to-cart effect to be refused")
    time.sleep(1)  # anything it might still write after the refusal
    run = runs.get_run(run_id)
    assert run.state == "cancelled"
    evs = events.read(run_id)
    cancel_at = next(i for i, e in enumerate(evs) if e.type == "run_cancelled")
    assert evs[cancel_at + 1:] == [], f"events after the cancel: {[e.type for e in evs[cancel_at + 1:]]}"
    assert cards.cards_for(run_id) == []
    v = check_run(run_id)
    assert v.holds == ["settled"]
    assert any(e.kind == "fence_rejected" for e in ledger.history(run_id)), "the holder was fenced out"


def test_cancel_queued_waiting_and_finished_runs(workers):
    queued = submit_run("erin", "buy a laptop")  # no worker yet
    assert cancel_run(queued, "erin").previous_state == "queued"
    assert check_run(queued).holds == ["settled"]
    workers.start("a")
    waiting = submit_run("erin", "monitor [ask]")
    wait_for(lambda: runs.get_run(waiting).state == "waiting", 30, "the run to wait")
    assert cancel_run(waiting, "erin").previous_state == "waiting"
    with pytest.raises(InvalidRequest):
        reply_to_run(waiting, "too late", "erin")
    done = submit_run("erin", "monitor")
    wait_terminal([done], timeout=30)
    result = cancel_run(done, "erin")
    assert result.noop and result.previous_state == "done"
    assert runs.get_run(done).state == "done"
    time.sleep(1)
    assert runs.get_run(queued).state == "cancelled", "the queued run's wake-up found it cancelled"


def test_rolling_restart_under_load_interrupts_nothing(workers):
    pool = [workers.start(name, FENCED_STUB_STEP_MS="300") for name in ("a", "b", "c")]
    ids = [submit_run(f"u{i}", f"buy item {i}") for i in range(12)]
    for w in pool:
        time.sleep(1.0)
        w.stop(timeout=30)  # SIGTERM: drain the step in flight
        w.start()
    wait_terminal(ids, timeout=90)
    for run_id in ids:
        v = check_run(run_id)
        assert v.ok, (run_id, v.failures)
        assert v.takeovers == 0, f"{run_id} was interrupted"


@pytest.mark.parametrize("pool", ["threads", "gevent"])
def test_a_step_that_overruns_the_drain_is_taken_over(workers, pool):
    """On gevent the drain clock is started off the hub (Celery runs the shutdown signal's handlers there,
    where starting a timer raised BlockingSwitchOutError and the drain went unbounded)."""
    if pool == "gevent":
        require_extra("gevent")
    # a's step (10 s) must still be running when the SIGTERM comes, after b's start-up (seconds on a
    # loaded machine): with 4 s steps it sometimes ended first and the drain had nothing to overrun.
    a = workers.start("a", pool=pool, FENCED_STUB_STEP_MS="10000", FENCED_DRAIN_S="1")
    run_id = submit_run("u1", "buy a keyboard")
    wait_for(lambda: workers.holder_of(run_id) is a, 20, "a to hold the run")
    workers.start("b", FENCED_STUB_STEP_MS="200")
    a.kill(signal.SIGTERM)
    a.proc.wait(15)
    wait_terminal([run_id], timeout=40)
    v = check_run(run_id)
    assert v.ok, v.failures
    assert v.takeovers == 1
    assert "drain_overrun" in a.logs()
    assert "BlockingSwitchOutError" not in a.logs() and "registry_drain_mark_failed" not in a.logs()


def test_dead_letter_list_show_and_replay_with_a_fresh_budget(workers):
    a = workers.start("a", FENCED_RETRY_BUDGET="1")
    run_id = submit_run("u1", "buy a lamp [transient:3]")
    [dead] = wait_terminal([run_id], timeout=30)
    assert dead.state == "dead"
    assert [d.run_id for d in lifecycle.dead_letters_list()] == [run_id]
    letter = lifecycle.dead_letter(run_id)
    assert "retries" in letter.reason and letter.attempts
    assert check_run(run_id).holds == ["held"], "kept open for a replay"
    a.stop()
    workers.start("b", FENCED_RETRY_BUDGET="5")
    assert replay_dead_letter(run_id, "ops-oncall") == dead.step
    [done] = wait_terminal([run_id], timeout=40)
    assert done.state == "done"
    replayed = [e for e in ledger.history(run_id) if e.kind == "replayed"]
    assert [e.actor for e in replayed] == ["ops-oncall"]
    assert lifecycle.dead_letter(run_id).replays == 1
    assert check_run(run_id).holds == ["settled"]


def test_cancel_gives_the_users_admission_slot_back(mysql_store):
    run_id = submit_run("slot-user", "buy a lamp")  # no worker: it stays queued
    assert run_id in get_redis().zrange(keys.user_slots("slot-user"), 0, -1)
    cancel_run(run_id, "slot-user")
    assert run_id not in get_redis().zrange(keys.user_slots("slot-user"), 0, -1)
