"""User balances on MariaDB and SQLite: holds, settlement once, release, refusals, never negative."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from checkpoints import accounts, billing, ledger, lifecycle, runs
from checkpoints.db import in_txn, transaction
from checkpoints.runs import Usage
from checkpoints.schema import run_checkpoints, run_holds, user_accounts
from fenced_core.errors import InsufficientCredits


def new_run(user: str = "u1", kind: str = "normal") -> str:
    run_id = runs.new_run_id()
    in_txn(runs.create_run_txn, run_id, user, kind, "buy headphones", "test")
    return run_id


def balance(user: str = "u1") -> tuple[int, int]:
    a = accounts.get_account(user)
    return a.balance_credits, a.held_credits


def hold_state(run_id: str) -> tuple[str, int | None]:
    with transaction() as conn:
        row = conn.execute(sa.select(run_holds.c.state, run_holds.c.credits_charged)
                           .where(run_holds.c.run_id == run_id)).one()
    return row.state, row.credits_charged


def count(table: sa.Table) -> int:
    with transaction() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() or 0)


def test_a_user_never_seen_has_the_default_balance(store):
    a = accounts.get_account("nobody")
    assert (a.balance_credits, a.held_credits, a.available_credits) == (1000, 0, 1000)
    assert count(user_accounts) == 0, "reading writes nothing"


def test_a_hold_reduces_what_is_available(store):
    new_run()
    new_run(kind="large")
    a = accounts.get_account("u1")
    assert (a.balance_credits, a.held_credits, a.available_credits) == (1000, 80, 920)


def test_settlement_charges_once(store):
    run_id = new_run()
    c = runs.claim(runs.get_run(run_id), "w/1")
    charge = runs.finish(c, "done", {}, Usage(2400, 800, 4), "", answer="ok")
    assert charge == 16
    assert balance() == (984, 0)
    again = in_txn(billing.settle_txn, run_id, c.epoch, "w/1", 2400, 800, runs.now_ms())
    assert again is None, "a second settlement finds the hold closed"
    assert balance() == (984, 0)
    assert hold_state(run_id) == ("settled", 16)
    assert [e.kind for e in ledger.history(run_id)].count("settled") == 1


def test_release_returns_the_hold(store):
    run_id, kept = new_run(), new_run()
    assert in_txn(billing.release_txn, run_id, 0, "test", "cancelled", runs.now_ms()) is True
    assert in_txn(billing.release_txn, run_id, 0, "test", "cancelled", runs.now_ms()) is False
    assert balance() == (1000, 20)
    assert hold_state(run_id) == ("released", 0) and hold_state(kept) == ("held", None)


def test_expiry_releases_the_hold_of_a_run_never_claimed(store):
    stale = new_run()
    expired = in_txn(lifecycle.expire_holds_txn, runs.now_ms() + 10**9, "sweeper")
    assert expired == [stale]
    assert balance() == (1000, 0)
    assert hold_state(stale) == ("released", 0)


def test_insufficient_credits_refused_with_nothing_written(store, settings_env):
    settings_env(default_balance_credits=30)
    new_run()
    with pytest.raises(InsufficientCredits) as refused:
        new_run()
    assert (refused.value.needed, refused.value.available) == (20, 10)
    assert "10 credits available" in str(refused.value)
    with pytest.raises(InsufficientCredits):
        new_run("u2", kind="large")
    assert (count(run_checkpoints), count(run_holds), count(user_accounts)) == (1, 1, 1)
    assert balance() == (30, 20)


def test_a_balance_never_goes_negative(store, settings_env):
    settings_env(default_balance_credits=20)
    run_id = new_run()
    c = runs.claim(runs.get_run(run_id), "w/1")
    charge = runs.finish(c, "done", {}, Usage(10**6, 10**6, 99), "", answer="ok")
    assert charge == 20, "the charge is capped at the hold"
    assert balance() == (0, 0)
    with pytest.raises(InsufficientCredits):
        new_run()
    assert balance() == (0, 0)


def test_concurrent_submits_never_overdraw(store, settings_env):
    settings_env(default_balance_credits=100)  # five holds of 20, for a user created by the race itself
    results: list[str] = []
    lock = threading.Lock()

    def submit() -> None:
        try:
            new_run("racer")
            outcome = "ok"
        except InsufficientCredits:
            outcome = "refused"
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == ["ok"] * 5 + ["refused"] * 3
    assert balance("racer") == (100, 100)


def test_a_dead_runs_hold_is_settled_after_the_hold_expiry(store, settings_env):
    settings_env(hold_expiry_s=60)
    dead, recent = new_run(), new_run()
    now = runs.now_ms()
    for run_id, died_at in ((dead, now - 61_000), (recent, now - 1_000)):
        c = runs.claim(runs.get_run(run_id), "w/1")
        runs.write_decided(c, 0, {}, Usage(1500, 500, 1), "")
        # As runs.dead_letter leaves it once a dead run's hold waits for a replay.
        with transaction() as conn:
            conn.execute(run_checkpoints.update().where(run_checkpoints.c.run_id == run_id)
                         .values(state="dead", owner=None, finished_at_ms=died_at))
    closed = in_txn(lifecycle.close_stale_holds_txn, now, "sweeper")
    assert closed == [lifecycle.Closed(dead, "u1", "settled")]
    assert hold_state(dead) == ("settled", 10), "what was used: 2000 tokens"
    assert hold_state(recent) == ("held", None), "a replay may still come"
    assert balance() == (990, 20)
    settled = [e for e in ledger.history(dead) if e.kind == "settled"]
    assert len(settled) == 1 and "dead for over 60 s" in settled[0].reason
    assert in_txn(lifecycle.close_stale_holds_txn, now, "sweeper") == [], "closed once"
    assert balance() == (990, 20)


def test_a_hold_the_account_does_not_carry_is_recorded_not_forced(store):
    run_id = runs.new_run_id()
    now = runs.now_ms()
    with transaction() as conn:  # a hold written before accounts existed: no account row carries it
        conn.execute(run_holds.insert().values(run_id=run_id, user_id="legacy", credits_held=20, state="held",
                                               created_at_ms=now, expires_at_ms=now + 1))
    assert in_txn(billing.settle_txn, run_id, 1, "w/1", 800, 0, now) == 4
    assert count(user_accounts) == 0
    assert [e.kind for e in ledger.history(run_id)] == ["account_mismatch", "settled"]
