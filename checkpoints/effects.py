"""Idempotent effects: a write tool's effect is keyed by run + action + payload fingerprint and fenced.

Replaying a recorded decision (after a crash, or by a zombie) hits the same key and gets the first
result back. The cart confirmation card is the first user.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from checkpoints import ledger
from checkpoints.db import in_txn, transaction
from checkpoints.runs import Claim, fenced_update_txn, now_ms
from checkpoints.schema import cart_cards


def fingerprint(payload: Any) -> str:
    """A stable digest of a JSON payload (keys sorted); callers sort lists whose order is meaningless."""
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def request_key(run_id: str, action: str, payload: Any) -> str:
    return f"{run_id}:{action}:{fingerprint(payload)}"


@dataclass(frozen=True)
class Card:
    card_id: str
    request_key: str
    run_id: str
    operation_id: str
    items: list[dict[str, Any]]
    total_cents: int
    state: str
    reused: bool = False


def _card(row: Any, reused: bool) -> Card:
    return Card(row["card_id"], row["request_key"], row["run_id"], row["operation_id"], json.loads(row["items"]),
                row["total_cents"], row["state"], reused)


def create_cart_card(c: Claim, items: list[dict[str, Any]]) -> Card:
    """Offer an add-to-cart confirmation card once per (run, items); a replay returns the first card."""
    ordered = sorted(({"id": i["id"], "name": i["name"], "price_cents": int(i["price_cents"]),
                       "qty": int(i.get("qty", 1))} for i in items), key=lambda i: i["id"])
    key = request_key(c.run.run_id, "add_to_cart", ordered)
    return in_txn(_create_card_txn, c, key, ordered)


def _create_card_txn(conn: Connection, c: Claim, key: str, items: list[dict[str, Any]]) -> Card:
    # Fence first: a holder that lost the run may not create effects, even idempotent ones.
    fenced_update_txn(conn, c.run.run_id, c.epoch, "add_to_cart effect")
    existing = conn.execute(sa.select(cart_cards).where(cart_cards.c.request_key == key)).mappings().first()
    if existing:
        ledger.record_txn(conn, c.run.run_id, c.epoch, c.token, "card_reused",
                          f"replayed add_to_cart hit request key {key}", {"card_id": existing["card_id"]})
        return _card(existing, reused=True)
    card_id = f"card_{uuid.uuid4().hex[:16]}"
    values = dict(card_id=card_id, request_key=key, run_id=c.run.run_id, operation_id=f"op_{uuid.uuid4().hex}",
                  items=json.dumps(items, sort_keys=True), total_cents=sum(i["price_cents"] * i["qty"] for i in items),
                  state="offered", epoch=c.epoch, created_at_ms=now_ms())
    try:
        with conn.begin_nested():
            conn.execute(cart_cards.insert().values(**values))
    except sa.exc.IntegrityError:
        # A concurrent holder with the same decision won the insert: its card is the card.
        row = conn.execute(sa.select(cart_cards).where(cart_cards.c.request_key == key)).mappings().one()
        return _card(row, reused=True)
    ledger.record_txn(conn, c.run.run_id, c.epoch, c.token, "card_created",
                      f"add_to_cart card {card_id} for {len(items)} item(s)", {"request_key": key})
    return _card(values, reused=False)


def cards_for(run_id: str) -> list[Card]:
    with transaction(readonly=True) as conn:
        rows = conn.execute(sa.select(cart_cards).where(cart_cards.c.run_id == run_id)
                            .order_by(cart_cards.c.created_at_ms)).mappings().all()
    return [_card(r, reused=False) for r in rows]
