"""Money and effects (issue 10) on MariaDB and SQLite: identifiers compare byte for byte, a card is keyed
by its decision and validated, only a live or done run's card can be confirmed, an expired card is
renewed on replay, and a replayed dead letter is admitted and pays for what it uses."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from checkpoints import accounts, ledger, lifecycle, runs
from checkpoints.db import in_txn, transaction
from checkpoints.runs import Claim, Usage
from checkpoints.schema import dead_letters, run_holds, user_accounts
from checkpoints.schema import effects as effects_table
from examples.shopping import cards, catalog, shopping
from examples.shopping.schema import cart_cards, orders
from fenced_core.errors import AdmissionRefused, FixableError, InsufficientCredits, InvalidRequest
from fencing import admission, keys
from fencing.connection import get_redis
from tasks import context
from tasks.control import replay_dead_letter
from tasks.submit import ADMISSION_QUEUES


def new_run(user: str = "u1", kind: str = "normal") -> str:
    run_id = runs.new_run_id()
    in_txn(runs.create_run_txn, run_id, user, kind, "buy headphones", "test")
    return run_id


def claim(run_id: str, token: str) -> Claim:
    run = runs.get_run(run_id)
    assert run is not None
    c = runs.claim(run, token)
    assert c is not None
    return c


def add_to_cart(c: Claim, args: dict[str, Any], call_id: str = "call-1") -> dict[str, Any]:
    with context.running(context.RunContext(c, c.run.step, call_id)):
        return shopping.tools["add_to_cart"].call(args)


def count(table: sa.Table) -> int:
    with transaction(readonly=True) as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() or 0)


def hold_row(run_id: str) -> dict[str, Any]:
    with transaction(readonly=True) as conn:
        return dict(conn.execute(sa.select(run_holds).where(run_holds.c.run_id == run_id)).mappings().one())


def balance(user: str) -> tuple[int, int]:
    a = accounts.get_account(user)
    return a.balance_credits, a.held_credits


# -- 11: identifiers compare byte for byte ---------------------------------------------------------

LOOKALIKES = ["alice", "Alice", "alice ", "alicé", "ALICE"]


def test_user_ids_differing_in_case_accent_or_trailing_space_are_separate_accounts(store):
    for user in LOOKALIKES:
        new_run(user)
    assert [balance(u) for u in LOOKALIKES] == [(1000, 20)] * len(LOOKALIKES), \
        "each user's hold is on their own account"
    assert count(user_accounts) == len(LOOKALIKES)
    # A settlement moves only its own user's account.
    with transaction(readonly=True) as conn:
        alice_run = conn.execute(sa.select(run_holds.c.run_id).where(run_holds.c.user_id == "Alice")).scalar_one()
    runs.finish(claim(alice_run, "w/1"), "done", {}, Usage(3000, 1000, 1), "", answer="ok")
    assert balance("Alice") == (980, 0)
    assert [balance(u) for u in LOOKALIKES if u != "Alice"] == [(1000, 20)] * (len(LOOKALIKES) - 1)


def test_card_run_and_request_ids_are_looked_up_exactly(store):
    run_id = new_run("alice")
    c = claim(run_id, "w/1")
    card = cards.create_cart_card(c, [{"id": "sku-001", "name": "a", "price_cents": 100}])
    with pytest.raises(InvalidRequest, match="no cart card"):
        cards.get_card(card.card_id.upper())
    with pytest.raises(InvalidRequest, match="no cart card"):
        cards.confirm_card(card.card_id.upper() + " ", "alice")
    assert runs.get_run(run_id.upper()) is None
    with transaction(readonly=True) as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(effects_table)
                            .where(effects_table.c.request_key == card.request_key.upper())).scalar() == 0
    assert count(orders) == 0


IDENTIFIER_COLUMNS = {
    "run_checkpoints": ["run_id", "user_id"], "run_steps": ["run_id"], "run_holds": ["run_id", "user_id"],
    "run_attempts": ["run_id"], "run_ledger": ["run_id"], "effects": ["request_key", "run_id"],
    "cart_cards": ["card_id", "request_key", "run_id", "user_id", "operation_id"],
    "orders": ["order_id", "operation_id", "card_id", "user_id"],
    "run_inputs": ["run_id", "tool_call_id", "replied_by"], "user_accounts": ["user_id"],
    "dead_letters": ["run_id", "replayed_by"],
}


def test_every_identifier_column_has_a_binary_no_pad_collation_on_mysql(mysql_store):
    with transaction(readonly=True) as conn:
        rows = conn.execute(sa.text(
            "SELECT table_name, column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE()")).all()
    collations = {(t, c): coll for t, c, coll in rows}
    wrong = {f"{t}.{c}": collations.get((t, c)) for t, cols in IDENTIFIER_COLUMNS.items() for c in cols
             if collations.get((t, c)) not in ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")}
    assert not wrong, f"identifier columns without a byte-exact collation: {wrong}"


# -- 12: a card's key covers its decision, not the catalog -----------------------------------------

def test_a_replay_after_a_price_change_returns_the_first_card(store, monkeypatch):
    run_id = new_run("alice")
    decision = {"items": [{"id": "sku-005", "qty": 2}, {"id": "sku-001", "qty": 1}]}
    first = add_to_cart(claim(run_id, "w/1"), decision)
    price = catalog.BY_ID["sku-005"]["price_cents"]
    expected = 2 * price + catalog.BY_ID["sku-001"]["price_cents"]
    assert first["total_cents"] == expected and not first["reused"]
    monkeypatch.setitem(catalog.BY_ID, "sku-005", {**catalog.BY_ID["sku-005"], "price_cents": 123_456,
                                                   "name": "Renamed thing"})
    # A takeover replays the recorded decision (items in another order) after the price changed.
    again = add_to_cart(claim(run_id, "w/2"), {"items": list(reversed(decision["items"]))})
    assert again == {**first, "reused": True}, "the first card, at the price it was offered at"
    [card] = cards.cards_for(run_id)
    assert card.total_cents == expected
    assert {i["id"]: (i["qty"], i["price_cents"]) for i in card.items}["sku-005"] == (2, price)
    # A different decision (another quantity) is another card.
    other = add_to_cart(claim(run_id, "w/3"), {"items": [{"id": "sku-005", "qty": 3}, {"id": "sku-001"}]})
    assert other["card_id"] != first["card_id"] and len(cards.cards_for(run_id)) == 2


# -- 13: tool inputs are validated, totals cannot overflow -----------------------------------------

@pytest.mark.parametrize("qty", [-3, 0, 0.5, 100, 10**12, "2", True, None, [1]])
def test_a_bad_quantity_is_a_fixable_error_naming_the_field_and_writes_nothing(store, qty):
    c = claim(new_run("alice"), "w/1")
    with pytest.raises(FixableError, match=r"items\[1\]\.qty"):
        add_to_cart(c, {"items": [{"id": "sku-001", "qty": 1}, {"id": "sku-002", "qty": qty}]})
    assert (count(cart_cards), count(effects_table)) == (0, 0)


@pytest.mark.parametrize("args, field", [
    ({}, "items"), ({"items": []}, "items"), ({"items": "sku-001"}, "items"), ({"items": ["sku-001"]}, r"items\[0\]"),
    ({"items": [{"qty": 1}]}, r"items\[0\]\.id"), ({"items": [{"id": 7}]}, r"items\[0\]\.id"),
    ({"items": [{"id": "sku-001", "qty": 60}, {"id": "sku-001", "qty": 40}]}, r"qty"),
])
def test_bad_cart_items_are_fixable_errors_naming_the_field(store, args, field):
    c = claim(new_run("alice"), "w/1")
    with pytest.raises(FixableError, match=field):
        add_to_cart(c, args)
    assert count(cart_cards) == 0


def test_the_largest_valid_cart_is_stored_exactly_and_the_effect_layer_refuses_bad_quantities(store):
    c = claim(new_run("alice"), "w/1")
    biggest = add_to_cart(c, {"items": [{"id": i, "qty": 99} for i in catalog.BY_ID]})
    assert biggest["total_cents"] == 99 * sum(i["price_cents"] for i in catalog.ITEMS)
    assert cards.get_card(biggest["card_id"]).total_cents == biggest["total_cents"]
    for qty in (-3, 0, 10**12, 1.5):
        with pytest.raises(InvalidRequest, match="qty"):
            cards.create_cart_card(c, [{"id": "sku-001", "name": "a", "price_cents": 100, "qty": qty}])
    assert count(cart_cards) == 1
    # Merged duplicates are one line of the card.
    merged = add_to_cart(c, {"items": [{"id": "sku-001", "qty": 2}, {"id": "sku-001", "qty": 3}]})
    assert [(i["id"], i["qty"]) for i in cards.get_card(merged["card_id"]).items] == [("sku-001", 5)]


# -- 14: a card of a cancelled, failed or dead run cannot be confirmed; an expired one is renewed ---

def _end_run(run_id: str, how: str) -> None:
    if how == "cancelled":
        lifecycle.cancel(run_id, "alice")
        return
    c = claim(run_id, "w/2")
    if how == "dead":
        runs.dead_letter(c, "poison", {})
    else:
        runs.finish(c, how, {}, Usage(100, 100, 1), "", answer="ok" if how == "done" else None,
                    error_class=None if how == "done" else "terminal", error=None if how == "done" else "boom")


@pytest.mark.parametrize("how", ["cancelled", "failed", "dead"])
def test_a_card_of_a_cancelled_failed_or_dead_run_is_refused(store, how):
    run_id = new_run("alice")
    card = cards.create_cart_card(claim(run_id, "w/1"), [{"id": "sku-001", "name": "a", "price_cents": 100}])
    _end_run(run_id, how)
    before = len(ledger.history(run_id))
    with pytest.raises(InvalidRequest, match=how):
        cards.confirm_card(card.card_id, "alice")
    assert count(orders) == 0
    assert cards.get_card(card.card_id).state == "offered"
    assert len(ledger.history(run_id)) == before, "nothing written"


@pytest.mark.parametrize("how", ["live", "done"])
def test_a_card_of_a_live_or_done_run_is_confirmed(store, how):
    run_id = new_run("alice")
    card = cards.create_cart_card(claim(run_id, "w/1"), [{"id": "sku-001", "name": "a", "price_cents": 100}])
    if how == "done":
        _end_run(run_id, "done")
    order = cards.confirm_card(card.card_id, "alice")
    assert not order.reused and count(orders) == 1
    assert cards.get_card(card.card_id).state == "confirmed"


def _expire(card_id: str) -> None:
    with transaction() as conn:
        conn.execute(cart_cards.update().where(cart_cards.c.card_id == card_id).values(expires_at_ms=1))


def test_a_replay_after_the_card_expired_offers_a_fresh_card(store):
    run_id = new_run("alice")
    decision = {"items": [{"id": "sku-001", "qty": 2}]}
    first = add_to_cart(claim(run_id, "w/1"), decision)
    _expire(first["card_id"])
    with pytest.raises(InvalidRequest, match="expired"):
        cards.confirm_card(first["card_id"], "alice")
    renewed = add_to_cart(claim(run_id, "w/2"), decision)  # a takeover replays the decision
    assert renewed["card_id"] != first["card_id"] and not renewed["reused"]
    assert renewed["total_cents"] == first["total_cents"]
    fresh = cards.get_card(renewed["card_id"])
    old = cards.get_card(first["card_id"])
    assert fresh.operation_id != old.operation_id, "a new operation"
    assert fresh.expires_at_ms > runs.now_ms()
    renewals = [e for e in ledger.history(run_id) if e.kind == "effect_renewed"]
    assert len(renewals) == 1 and first["card_id"] in renewals[0].reason
    # The replay after that returns the fresh card, and it can be confirmed.
    assert add_to_cart(claim(run_id, "w/3"), decision) == {**renewed, "reused": True}
    assert cards.confirm_card(renewed["card_id"], "alice").order_id
    # A confirmed card that expires afterwards is still the decision's card: no new one.
    _expire(renewed["card_id"])
    assert add_to_cart(claim(run_id, "w/4"), decision)["card_id"] == renewed["card_id"]
    assert len(cards.cards_for(run_id)) == 2 and count(orders) == 1


# -- 16: a replayed dead letter is admitted and pays for what it uses ------------------------------

def _dead_and_settled(user: str) -> str:
    """A run that used 3200 tokens (16 credits), died, and whose hold the sweeper settled."""
    run_id = new_run(user)
    c = claim(run_id, "w/1")
    runs.write_decided(c, 0, {"decision": {}}, Usage(2400, 800, 1), "")
    runs.dead_letter(c, "poison", {})
    closed = in_txn(lifecycle.close_stale_holds_txn, runs.now_ms() + 10**9, "sweeper")
    assert [(x.run_id, x.outcome) for x in closed] == [(run_id, "settled")]
    assert balance(user) == (984, 0)
    return run_id


def test_a_replay_after_settlement_takes_a_fresh_hold_and_charges_only_the_new_usage(store):
    run_id = _dead_and_settled("dora")
    assert replay_dead_letter(run_id, "ops") == 0
    h = hold_row(run_id)
    assert (h["state"], h["credits_held"], h["credits_charged"], h["credits_charged_before"]) == ("held", 20, None, 16)
    assert balance("dora") == (984, 20), "the replay's hold is on the account"
    assert run_id in get_redis().zrange(keys.user_slots("dora"), 0, -1), "the replay counts toward the user's limit"
    assert "hold_reopened" in [e.kind for e in ledger.history(run_id)]
    c = claim(run_id, "w/2")
    charge = runs.finish(c, "done", {}, Usage(2400 + 800, 800, 2), "", answer="ok")  # 800 more tokens
    assert charge == 4, "only the usage since the replay"
    assert balance("dora") == (980, 0)
    h = hold_row(run_id)
    assert (h["state"], h["credits_charged"], h["credits_charged_before"]) == ("settled", 4, 16)


def test_a_replay_with_its_hold_still_open_keeps_it(store):
    run_id = new_run("erin")
    c = claim(run_id, "w/1")
    runs.write_decided(c, 0, {"decision": {}}, Usage(2400, 800, 1), "")
    runs.dead_letter(c, "poison", {})
    replay_dead_letter(run_id, "ops")
    assert balance("erin") == (1000, 20), "no second hold"
    charge = runs.finish(claim(run_id, "w/2"), "done", {}, Usage(3200, 800, 2), "", answer="ok")
    assert charge == 20 and balance("erin") == (980, 0), "all usage, capped by the one hold"


def _nothing_written(run_id: str, user: str, account: tuple[int, int]) -> None:
    run = runs.get_run(run_id)
    assert run is not None and run.state == "dead"
    h = hold_row(run_id)
    assert (h["state"], h["credits_charged"]) == ("settled", 16)
    assert balance(user) == account
    with transaction(readonly=True) as conn:
        assert conn.execute(sa.select(dead_letters.c.replays).where(dead_letters.c.run_id == run_id)).scalar() == 0
    assert "replayed" not in [e.kind for e in ledger.history(run_id)]


def test_a_replay_refused_by_admission_writes_nothing(store, settings_env):
    settings_env(max_runs_per_user=1)
    run_id = _dead_and_settled("finn")
    admission.admit("another-run", "finn", ADMISSION_QUEUES)
    with pytest.raises(AdmissionRefused, match="finn"):
        replay_dead_letter(run_id, "ops")
    _nothing_written(run_id, "finn", (984, 0))
    assert run_id not in get_redis().zrange(keys.user_slots("finn"), 0, -1)


def test_a_replay_the_user_cannot_pay_for_writes_nothing(store):
    run_id = _dead_and_settled("gus")
    with transaction() as conn:
        conn.execute(user_accounts.update().where(user_accounts.c.user_id == "gus").values(balance_credits=10))
    with pytest.raises(InsufficientCredits):
        replay_dead_letter(run_id, "ops")
    _nothing_written(run_id, "gus", (10, 0))
    assert run_id not in get_redis().zrange(keys.user_slots("gus"), 0, -1), "the admission slot was given back"


def test_replaying_a_run_that_is_not_dead_keeps_its_admission_slot(store):
    run_id = new_run("hal")
    admission.admit(run_id, "hal", ADMISSION_QUEUES)
    with pytest.raises(InvalidRequest, match="only dead runs"):
        replay_dead_letter(run_id, "ops")
    assert run_id in get_redis().zrange(keys.user_slots("hal"), 0, -1)
