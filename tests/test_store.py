"""The run store on MariaDB and SQLite: the claim, every fenced write, settlement and effects."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from checkpoints import billing, codec, ledger, lifecycle, runs
from checkpoints.db import in_txn, transaction
from checkpoints.runs import Usage
from checkpoints.schema import run_holds
from examples.shopping import cards
from examples.shopping.schema import cart_cards
from fenced_core.errors import FencedOut, InvalidRequest


def new_run(kind: str = "normal", query: str = "buy headphones") -> runs.Run:
    run_id = runs.new_run_id()
    in_txn(runs.create_run_txn, run_id, "user-1", kind, query, "test")
    run = runs.get_run(run_id)
    assert run is not None
    return run


def hold(run_id: str) -> dict:
    with transaction() as conn:
        return dict(conn.execute(sa.select(run_holds).where(run_holds.c.run_id == run_id)).mappings().one())


def test_submit_writes_row_and_hold_together(store):
    run = new_run("large")
    assert (run.state, run.epoch, run.step, run.phase) == ("queued", 0, 0, "none")
    h = hold(run.run_id)
    assert (h["state"], h["credits_held"]) == ("held", 60)
    assert hold(new_run("normal").run_id)["credits_held"] == 20


def test_bad_input_writes_nothing(store):
    with pytest.raises(InvalidRequest):
        in_txn(runs.create_run_txn, "bad", "u", "huge", "q", "test")
    with pytest.raises(InvalidRequest):
        in_txn(runs.create_run_txn, "bad", "u", "normal", "   ", "test")
    assert runs.get_run("bad") is None
    with transaction() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(run_holds)).scalar() == 0


def test_claim_bumps_the_epoch_and_names_the_previous_holder(store):
    run = new_run()
    first = runs.claim(run, "worker-a/1")
    assert first is not None and first.epoch == 1 and not first.takeover
    second = runs.claim(run, "worker-b/1")
    assert second is not None and second.epoch == 2
    assert second.takeover and second.previous_owner == "worker-a/1"
    kinds = [e.kind for e in ledger.history(run.run_id)]
    assert kinds == ["submitted", "claimed", "takeover"]


def test_a_claim_runs_on_the_row_as_it_is_not_on_a_stale_snapshot(store):
    """Defect 3: a rescue read the row (phase none), then the slow holder, still owning its epoch, wrote
    checkpoint A. A claim that resumed from the snapshot would call the model again (paid twice) and
    could make a second card; the claim must resume from the row as it is at the claim."""
    run = new_run()
    holder = runs.claim(run, "slow/1")
    snapshot = runs.get_run(run.run_id)
    assert snapshot.phase == "none"
    runs.write_decided(holder, 0, {"decision": {"name": "planner"}}, Usage(10, 5, 1), "1-0")
    rescue = runs.claim(snapshot, "rescuer/1")
    assert rescue is not None and rescue.epoch == 2 and rescue.previous_owner == "slow/1"
    assert (rescue.run.phase, rescue.run.model_calls) == ("decided", 1), "resume from checkpoint A, no second call"
    assert rescue.run.checkpoint == {"decision": {"name": "planner"}}
    with pytest.raises(FencedOut):
        runs.write_step_done(holder, 0, {"history": []}, Usage(10, 5, 1), "")


def test_a_waiting_or_finished_run_is_not_claimed_from_a_live_snapshot(store):
    run = new_run()
    snapshot = runs.get_run(run.run_id)
    c = runs.claim(run, "w/1")
    runs.park(c, "which colour?", {}, Usage(), "")
    assert runs.claim(snapshot, "w/2") is None, "a parked run waits for its reply, not for a claim"
    assert runs.get_run(run.run_id).state == "waiting"


def test_stale_epoch_write_is_refused_everywhere(store):
    run = new_run()
    old = runs.claim(run, "old/1")
    new = runs.claim(runs.get_run(run.run_id), "new/1")
    usage = Usage(10, 5, 1)
    with pytest.raises(FencedOut):
        runs.write_decided(old, 0, {"decision": {}}, usage, "")
    with pytest.raises(FencedOut):
        runs.write_step_done(old, 0, {"history": []}, usage, "")
    with pytest.raises(FencedOut):
        runs.finish(old, "done", {}, usage, "", answer="zombie answer")
    with pytest.raises(FencedOut):
        cards.create_cart_card(old, [{"id": "sku-001", "name": "x", "price_cents": 100}])
    row = runs.get_run(run.run_id)
    assert (row.state, row.epoch, row.prompt_tokens, row.answer) == ("running", 2, 0, None)
    assert hold(run.run_id)["state"] == "held", "a fenced-out holder must not settle"
    with transaction() as conn:
        steps = conn.execute(sa.text("SELECT COUNT(*) FROM run_steps WHERE run_id = :r"), {"r": run.run_id}).scalar()
        outcome = conn.execute(sa.text("SELECT outcome FROM run_attempts WHERE id = :i"),
                               {"i": old.attempt_id}).scalar()
    # On MySQL each checkpoint is one query ending in COMMIT: every statement after the fenced UPDATE
    # must be fenced too, or a refused holder would still add its step row and close its attempt.
    assert steps == 0, "a fenced-out checkpoint writes no step row"
    assert outcome is None, "a fenced-out checkpoint B does not close the holder's attempt as step_done"
    runs.write_decided(new, 0, {"decision": {"x": 1}}, usage, "1-0")
    assert runs.get_run(run.run_id).phase == "decided"


def test_a_claim_for_another_step_writes_nothing(store):
    """A wake-up that took a handoff skips the row read; its claim checks the step under the lock."""
    run = new_run()
    assert runs.claim(run, "w/1", step=3) is None
    row = runs.get_run(run.run_id)
    assert (row.epoch, row.state, row.owner, row.deliveries) == (0, "queued", None, 0)
    with transaction() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM run_attempts WHERE run_id = :r"),
                            {"r": run.run_id}).scalar() == 0
    c = runs.claim(run, "w/2", step=0)
    assert c is not None and c.epoch == 1 and c.attempt_id > 0
    assert [e.kind for e in ledger.history(run.run_id)][-1] == "claimed"


def test_checkpoints_move_the_run_and_keep_history(store):
    run = new_run()
    c = runs.claim(run, "w/1")
    runs.write_decided(c, 0, {"history": [], "decision": {"name": "planner"}}, Usage(600, 200, 1), "1-1")
    mid = runs.get_run(run.run_id)
    assert (mid.phase, mid.step, mid.prompt_tokens) == ("decided", 0, 600)
    assert mid.checkpoint["decision"]["name"] == "planner"
    runs.write_step_done(c, 0, {"history": [{"step": 0}]}, Usage(600, 200, 1), "1-2")
    after = runs.get_run(run.run_id)
    assert (after.phase, after.step, after.owner, after.deliveries) == ("done", 1, None, 0)
    with transaction() as conn:
        phases = conn.execute(sa.text("SELECT phase FROM run_steps WHERE run_id = :r ORDER BY id"),
                              {"r": run.run_id}).scalars().all()
    assert phases == ["decided", "done"]
    with transaction() as conn:
        blobs = conn.execute(sa.text("SELECT checkpoint FROM run_steps WHERE run_id = :r ORDER BY id"),
                             {"r": run.run_id}).scalars().all()
    assert codec.decode(blobs[-1]) == after.checkpoint == {"history": [{"step": 0}]}, "a step row keeps its checkpoint"


def test_terminal_transaction_settles_exactly_once(store):
    run = new_run()
    c = runs.claim(run, "w/1")
    charge = runs.finish(c, "done", {}, Usage(3000, 1000, 4), "", answer="ok")
    assert charge == billing.credits_for(3000, 1000, 20) == 20
    h = hold(run.run_id)
    assert (h["state"], h["credits_charged"]) == ("settled", 20)
    # Even a direct second settlement (a bug, or a retried transaction) changes nothing.
    assert in_txn(billing.settle_txn, run.run_id, 1, "w/1", 1, 1, 0) is None
    assert hold(run.run_id)["credits_charged"] == 20
    assert runs.claim(runs.get_run(run.run_id), "w/2") is None, "a terminal run cannot be claimed"


def test_cart_card_is_one_per_decision_whatever_the_item_order(store):
    run = new_run()
    c = runs.claim(run, "w/1")
    items = [{"id": "sku-002", "name": "b", "price_cents": 200}, {"id": "sku-001", "name": "a", "price_cents": 100}]
    first = cards.create_cart_card(c, items)
    again = cards.create_cart_card(c, list(reversed(items)))
    assert not first.reused and again.reused and again.card_id == first.card_id
    assert first.request_key.startswith(f"{run.run_id}:add_to_cart:")
    assert first.total_cents == 300
    with transaction() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(cart_cards)).scalar() == 1
    # A takeover replaying the same decision gets the same card.
    c2 = runs.claim(runs.get_run(run.run_id), "w/2")
    assert cards.create_cart_card(c2, items).card_id == first.card_id


def test_unclaimed_hold_expires_and_run_fails_as_expired(store):
    stale, active = new_run(), new_run()
    runs.claim(active, "w/1")
    far_future = runs.now_ms() + 10**9
    expired = in_txn(lifecycle.expire_holds_txn, far_future, "sweeper")
    assert expired == [stale.run_id]
    assert hold(stale.run_id)["state"] == "released"
    assert runs.get_run(stale.run_id).state == "failed"
    assert hold(active.run_id)["state"] == "held", "a run someone claimed keeps its hold"


def test_stalled_lists_only_live_runs_without_progress(store):
    a, b = new_run(), new_run()
    c = runs.claim(b, "w/1")
    runs.finish(c, "done", {}, Usage(), "", answer="x")
    assert [r for r, _s, _k, _at in runs.stalled(runs.now_ms() + 1)] == [a.run_id]
    assert runs.stalled(runs.now_ms() - 60_000) == []


def test_dead_letter_keeps_attempts(store):
    run = new_run()
    runs.claim(run, "w/1")
    c = runs.claim(runs.get_run(run.run_id), "w/2")
    attempts = runs.dead_letter(c, "poison", {"note": "x"})
    assert len(attempts) == 2
    row = runs.get_run(run.run_id)
    assert (row.state, row.error_class) == ("dead", "dead")
    assert hold(run.run_id)["state"] == "held", "kept for a replay; the sweeper settles it if none comes"
    assert "dead_lettered" in [e.kind for e in ledger.history(run.run_id)]


def test_a_holder_frozen_inside_a_transaction_does_not_block_the_takeover(mysql_store, monkeypatch):
    """Found by the zombie scenario once steps got faster: a worker frozen between an UPDATE and its
    COMMIT keeps the run row locked, and the worker taking over waited as long as the freeze lasted.
    MariaDB now rolls such a transaction back after db_idle_txn_timeout_s and drops the session."""
    import time

    from checkpoints.db import _make_engine, dispose_all
    from fenced_core.settings import get_settings

    monkeypatch.setenv("FENCED_DB_IDLE_TXN_TIMEOUT_S", "2")
    get_settings.cache_clear()
    dispose_all()
    run = new_run()
    frozen = _make_engine(get_settings().db_url)  # another session, like another worker's
    conn = frozen.connect()
    trx = conn.begin()
    conn.execute(sa.text("UPDATE run_checkpoints SET updated_at_ms = 1 WHERE run_id = :r"), {"r": run.run_id})
    # ... and the "worker" freezes here, row locked, transaction open.
    started = time.monotonic()
    claim = runs.claim(run, "taker")
    waited = time.monotonic() - started
    assert claim is not None and claim.epoch == 1
    assert 1.5 < waited < 15, f"the takeover waited {waited:.1f} s on a frozen transaction"
    with pytest.raises(sa.exc.OperationalError):  # the frozen session was dropped, its write rolled back
        conn.execute(sa.text("SELECT 1"))
        trx.commit()
    frozen.dispose()
    after = runs.get_run(run.run_id)
    assert after is not None and after.updated_at_ms != 1
