"""Idempotent effects: a write tool's effect is keyed by run + action + payload fingerprint and fenced.

Replaying a recorded decision (after a crash, or by a zombie) hits the same key and gets the first
result back. The add-to-cart confirmation card is the first user; confirming a card places one order.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from checkpoints import ledger
from checkpoints.db import in_txn, transaction
from checkpoints.runs import Claim, fenced_update_txn, now_ms
from checkpoints.schema import cart_cards, effects, orders, run_checkpoints
from fenced.errors import InvalidRequest
from fenced.settings import get_settings


def fingerprint(payload: Any) -> str:
    """A stable digest of a JSON payload (keys sorted); callers sort lists whose order is meaningless."""
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def request_key(run_id: str, action: str, payload: Any) -> str:
    return f"{run_id}:{action}:{fingerprint(payload)}"


Create = Callable[[Connection, str], dict[str, Any]]  # (connection, request key) -> JSON-able result


def perform_once(c: Claim, action: str, payload: Any, create: Create) -> tuple[dict[str, Any], bool]:
    """Run `create` once per (run, action, payload) as holder `c`; returns (result, reused).

    The effect, its record and the fence check commit together: a fenced-out holder creates nothing,
    and a replay of the same decision, by anyone, gets the first result."""
    key = request_key(c.run.run_id, action, payload)
    return in_txn(_perform_once_txn, c, action, key, create)


def _perform_once_txn(conn: Connection, c: Claim, action: str, key: str, create: Create) -> tuple[dict[str, Any], bool]:
    fenced_update_txn(conn, c.run.run_id, c.epoch, f"{action} effect")
    done = conn.execute(sa.select(effects.c.result).where(effects.c.request_key == key)).scalar()
    if done is not None:
        ledger.record_txn(conn, c.run.run_id, c.epoch, c.token, "effect_reused",
                          f"{action} replayed: request key {key} already done, first result returned")
        return json.loads(done), True
    try:
        with conn.begin_nested():
            result = create(conn, key)
            conn.execute(effects.insert().values(request_key=key, run_id=c.run.run_id, action=action,
                                                 result=json.dumps(result, sort_keys=True), epoch=c.epoch,
                                                 created_at_ms=now_ms()))
    except sa.exc.IntegrityError:
        # A concurrent holder with the same decision won the insert: its result is the result.
        first = conn.execute(sa.select(effects.c.result).where(effects.c.request_key == key)).scalar_one()
        return json.loads(first), True
    ledger.record_txn(conn, c.run.run_id, c.epoch, c.token, "effect_created", f"{action} done once: {key}",
                      {"result": result})
    return result, False


@dataclass(frozen=True)
class Card:
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


def create_cart_card(c: Claim, items: list[dict[str, Any]]) -> Card:
    """Offer an add-to-cart confirmation card once per (run, items); a replay returns the first card."""
    ordered = sorted(({"id": i["id"], "name": i["name"], "price_cents": int(i["price_cents"]),
                       "qty": int(i.get("qty", 1))} for i in items), key=lambda i: i["id"])

    def create(conn: Connection, key: str) -> dict[str, Any]:
        now = now_ms()
        card_id = f"card_{uuid.uuid4().hex[:16]}"
        conn.execute(cart_cards.insert().values(
            card_id=card_id, request_key=key, run_id=c.run.run_id, user_id=c.run.user_id,
            operation_id=f"op_{uuid.uuid4().hex}", items=json.dumps(ordered, sort_keys=True),
            total_cents=sum(i["price_cents"] * i["qty"] for i in ordered), state="offered", epoch=c.epoch,
            created_at_ms=now, expires_at_ms=now + get_settings().card_ttl_s * 1000,
        ))
        return {"card_id": card_id}

    result, reused = perform_once(c, "add_to_cart", ordered, create)
    card = get_card(result["card_id"])
    return Card(**{**card.__dict__, "reused": reused})


def get_card(card_id: str) -> Card:
    with transaction(readonly=True) as conn:
        row = conn.execute(sa.select(cart_cards).where(cart_cards.c.card_id == card_id)).mappings().first()
    if row is None:
        raise InvalidRequest(f"no cart card {card_id!r}")
    return _card(row)


def cards_for(run_id: str) -> list[Card]:
    with transaction(readonly=True) as conn:
        rows = conn.execute(sa.select(cart_cards).where(cart_cards.c.run_id == run_id)
                            .order_by(cart_cards.c.created_at_ms)).mappings().all()
    return [_card(r) for r in rows]


@dataclass(frozen=True)
class Order:
    order_id: str
    operation_id: str
    card_id: str
    user_id: str
    created_at_ms: int
    reused: bool = False


def confirm_card(card_id: str, user_id: str) -> Order:
    """Place the card's order once: its idempotency key is the card's operation id.

    Confirming twice (a double click, a retry after a crash) returns the first order. Someone else's
    card or an expired one is refused with InvalidRequest and nothing is written."""
    return in_txn(_confirm_txn, card_id, user_id)


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
    conn.execute(cart_cards.update().where(cart_cards.c.card_id == card_id)
                 .values(state="confirmed", confirmed_at_ms=now))
    epoch = conn.execute(sa.select(run_checkpoints.c.epoch)
                         .where(run_checkpoints.c.run_id == card["run_id"])).scalar() or 0
    ledger.record_txn(conn, card["run_id"], epoch, user_id, "order_placed",
                      f"card {card_id} confirmed: order {order_id} under operation {card['operation_id']}")
    return Order(order_id, card["operation_id"], card_id, user_id, now)
