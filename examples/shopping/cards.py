"""Cart confirmation cards and orders: the shopping demo's effect, built on fenced.store.perform_once.

add_to_cart offers a card once per decision (run + item ids and quantities); a replay gets the first
card back, or a fresh one if the first expired unconfirmed. Confirming a card places one order, keyed
by the card's operation id, so a double click or a retried confirm yields one order number.

This module is the app's card provider (tasks.service.CardProvider): the package registers it with
`fenced.register_cards` on import, and `fenced cards`, `fenced confirm` and the HTTP API reach it through
the service. It uses only the public API (fenced, fenced.store, fenced.testing).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from examples.shopping.schema import cart_cards, orders
from examples.shopping.settings import get_shopping_settings
from fenced import InvalidRequest
from fenced.store import (
    ENDED_UNFINISHED_STATES,
    Claim,
    in_transaction,
    ledger_append,
    now_ms,
    perform_once,
    run_state,
    transaction,
)
from fenced.testing import fault_point

ACTION = "add_to_cart"  # the effect's action: part of every card's request key
MAX_QTY = 99  # per line of a card: bounds every total far below the column's range


@dataclass(frozen=True)
class Card:
    """A cart confirmation card as stored; `reused` says a replay got the first card of its decision."""

    card_id: str
    request_key: str
    run_id: str
    user_id: str
    operation_id: str
    items: list[dict[str, Any]]
    total_cents: int
    state: str
    expires_at_ms: int
    reused: bool = False


def _card(row: Any, reused: bool = False) -> Card:
    return Card(row["card_id"], row["request_key"], row["run_id"], row["user_id"], row["operation_id"],
                json.loads(row["items"]), row["total_cents"], row["state"], row["expires_at_ms"], reused)


def card_lines(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A card's lines, sorted by item id: id, name and price as looked up now, and a validated qty.

    Raises InvalidRequest for a quantity that is not a whole number from 1 to MAX_QTY, a negative
    price, or an item listed twice (the tool merges those before it gets here)."""
    lines: dict[str, dict[str, Any]] = {}
    for item in items:
        qty = item.get("qty", 1)
        if isinstance(qty, bool) or not isinstance(qty, int) or not 1 <= qty <= MAX_QTY:
            raise InvalidRequest(f"cart item {item.get('id')!r}: qty must be a whole number from 1 to {MAX_QTY}, "
                                 f"not {qty!r}")
        price = item["price_cents"]
        if isinstance(price, bool) or not isinstance(price, int) or price < 0:
            raise InvalidRequest(f"cart item {item.get('id')!r}: price_cents must be a whole number >= 0")
        if item["id"] in lines:
            raise InvalidRequest(f"cart item {item['id']!r} is listed twice")
        lines[item["id"]] = {"id": item["id"], "name": item["name"], "price_cents": price, "qty": qty}
    return [lines[i] for i in sorted(lines)]


def create_cart_card(c: Claim, items: list[dict[str, Any]]) -> Card:
    """Offer an add-to-cart confirmation card once per decision, as holder `c`; a replay returns the first card.

    Under a crash the card, its effect record and the fence check commit together or not at all; a
    holder fenced out by a takeover creates nothing, and the new holder's replay creates the card
    once. The idempotency key covers only what the recorded decision says (item ids and quantities,
    sorted by id), never catalog data looked up when the tool runs: the name and price are properties
    of the card, fixed when it is created, so a replay after a price change gets the first card at its
    first price. A replay that finds its card expired and never confirmed offers a fresh card (a new
    operation, at the prices passed now), since no one can confirm the old one any more."""
    lines = card_lines(items)
    decision = [{"id": i["id"], "qty": i["qty"]} for i in lines]

    def create(conn: Connection, key: str) -> dict[str, Any]:
        now = now_ms()
        # A renewal after expiry is another card of the same decision: key#2, key#3, ...
        keys = conn.execute(sa.select(cart_cards.c.request_key)
                            .where(cart_cards.c.run_id == c.run.run_id)).scalars().all()
        renewals = sum(1 for k in keys if k == key or k.startswith(f"{key}#"))
        card_id = f"card_{uuid.uuid4().hex[:16]}"
        conn.execute(cart_cards.insert().values(
            card_id=card_id, request_key=key if not renewals else f"{key}#{renewals + 1}", run_id=c.run.run_id,
            user_id=c.run.user_id, operation_id=f"op_{uuid.uuid4().hex}", items=json.dumps(lines, sort_keys=True),
            total_cents=sum(i["price_cents"] * i["qty"] for i in lines), state="offered", epoch=c.epoch,
            created_at_ms=now, expires_at_ms=now + get_shopping_settings().card_ttl_s * 1000,
        ))
        return {"card_id": card_id}

    def unusable(conn: Connection, first: dict[str, Any]) -> str | None:
        row = conn.execute(sa.select(cart_cards.c.state, cart_cards.c.expires_at_ms)
                           .where(cart_cards.c.card_id == first["card_id"])).first()
        if row is None:
            return "names no card"
        if row.state == "offered" and now_ms() > row.expires_at_ms:
            return f"is card {first['card_id']}, which expired unconfirmed at {row.expires_at_ms} ms"
        return None

    fault_point("before_effect", c.run.run_id)
    result, reused = perform_once(c, ACTION, decision, create, unusable)
    card = get_card(result["card_id"])
    return Card(**{**card.__dict__, "reused": reused})


def get_card(card_id: str) -> Card:
    """The card `card_id` as committed; InvalidRequest if there is none (ids compare byte for byte)."""
    with transaction(readonly=True) as conn:
        row = conn.execute(sa.select(cart_cards).where(cart_cards.c.card_id == card_id)).mappings().first()
    if row is None:
        raise InvalidRequest(f"no cart card {card_id!r}")
    return _card(row)


def cards_for(run_id: str) -> list[Card]:
    """The cards run `run_id` offered, oldest first (committed ones only: a fenced-out holder's never are)."""
    with transaction(readonly=True) as conn:
        rows = conn.execute(sa.select(cart_cards).where(cart_cards.c.run_id == run_id)
                            .order_by(cart_cards.c.created_at_ms)).mappings().all()
    return [_card(r) for r in rows]


# A run that ended without finishing its work (or was stopped) takes its real-world effect with it.
UNCONFIRMABLE_STATES = ENDED_UNFINISHED_STATES


@dataclass(frozen=True)
class Order:
    """An order placed from a card; `reused` says a repeated confirm got the first order back."""

    order_id: str
    operation_id: str
    card_id: str
    user_id: str
    created_at_ms: int
    reused: bool = False


def confirm_card(card_id: str, user_id: str) -> Order:
    """Place the card's order once: its idempotency key is the card's operation id.

    Confirming twice (a double click, a retry after a crash) returns the first order: the order, the
    card's new state and the ledger entry commit together, so a crash leaves all or none of them.
    Someone else's card, an expired one, or one whose run was cancelled, failed or dead-lettered is
    refused with InvalidRequest and nothing is written (a card of a live or done run can be confirmed,
    also while another worker takes the run over)."""
    return in_transaction(_confirm_txn, card_id, user_id)


def _confirm_txn(conn: Connection, card_id: str, user_id: str) -> Order:
    card = conn.execute(sa.select(cart_cards).where(cart_cards.c.card_id == card_id)
                        .with_for_update()).mappings().first()
    if card is None:
        raise InvalidRequest(f"no cart card {card_id!r}")
    if card["user_id"] != user_id:
        raise InvalidRequest(f"card {card_id} belongs to another user; nothing was ordered")
    existing = conn.execute(sa.select(orders).where(orders.c.operation_id == card["operation_id"])).mappings().first()
    if existing:
        return Order(existing["order_id"], existing["operation_id"], existing["card_id"], existing["user_id"],
                     existing["created_at_ms"], reused=True)
    # A shared lock: a cancel of the run waits for this order, or this confirm sees the cancel.
    run = run_state(conn, card["run_id"], lock=True)
    if run is None or run.state in UNCONFIRMABLE_STATES:
        state = run.state if run is not None else "gone"
        raise InvalidRequest(f"card {card_id} belongs to run {card['run_id']}, which is {state}; nothing was ordered")
    now = now_ms()
    if now > card["expires_at_ms"]:
        raise InvalidRequest(f"card {card_id} expired at {card['expires_at_ms']} ms; ask the agent again")
    order_id = f"ord_{uuid.uuid4().hex[:12]}"
    try:
        with conn.begin_nested():
            conn.execute(orders.insert().values(order_id=order_id, operation_id=card["operation_id"],
                                                card_id=card_id, user_id=user_id, created_at_ms=now))
    except sa.exc.IntegrityError:
        row = conn.execute(sa.select(orders).where(orders.c.operation_id == card["operation_id"])).mappings().one()
        return Order(row["order_id"], row["operation_id"], row["card_id"], row["user_id"], row["created_at_ms"],
                     reused=True)
    fault_point("in_confirm", card["run_id"])
    conn.execute(cart_cards.update().where(cart_cards.c.card_id == card_id)
                 .values(state="confirmed", confirmed_at_ms=now))
    ledger_append(conn, card["run_id"], run.epoch, user_id, "order_placed",
                      f"card {card_id} confirmed: order {order_id} under operation {card['operation_id']}")
    return Order(order_id, card["operation_id"], card_id, user_id, now)
