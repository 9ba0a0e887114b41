"""The demo agent's tools: read-only ones rerun on replay, the effect hits its idempotency key."""

from __future__ import annotations

from typing import Any

from agents.loop import Tool
from examples.shopping import catalog
from examples.shopping.cards import MAX_QTY, create_cart_card
from fenced_core.errors import FixableError, TerminalError
from tasks import context


def _item_search(args: dict[str, Any]) -> Any:
    return catalog.search(str(args.get("query", "")), int(args.get("limit", 5)))


def _compare(args: dict[str, Any]) -> Any:
    ids = list(args.get("item_ids", []))
    missing = [i for i in ids if i not in catalog.BY_ID]
    if missing:
        raise TerminalError(f"compare: unknown item ids {missing}")
    items = [catalog.BY_ID[i] for i in ids]
    # Best value: rating per dollar, rating breaks ties.
    ranked = sorted(items, key=lambda i: (-(i["rating"] / (i["price_cents"] / 100)), -i["rating"], i["id"]))
    return {"ranked": [i["id"] for i in ranked], "best": ranked[0] if ranked else None}


def _add_to_cart(args: dict[str, Any]) -> Any:
    # The card is keyed by the decision (ids and quantities); name and price are looked up now and
    # fixed on the card when it is first created.
    items = [{**catalog.BY_ID[item_id], "qty": qty} for item_id, qty in cart_request(args)]
    card = create_cart_card(context.current().claim, items)
    return {"card_id": card.card_id, "total_cents": card.total_cents, "reused": card.reused}


def cart_request(args: dict[str, Any]) -> list[tuple[str, int]]:
    """add_to_cart's input, validated: (item id, qty) sorted by id, an item listed twice merged.

    Bad input is a FixableError naming the field (the model, or the person, can correct it): `items`
    must be a non-empty list of objects, `items[n].id` a catalog id, `items[n].qty` (default 1) a
    whole number from 1 to MAX_QTY, also once an item's lines are added up."""
    raw = args.get("items")
    if not isinstance(raw, list) or not raw:
        raise FixableError(f"add_to_cart: items must be a non-empty list of {{id, qty}} objects, not {raw!r}")
    qty_by_id: dict[str, int] = {}
    unknown = []
    for n, item in enumerate(raw):
        if not isinstance(item, dict):
            raise FixableError(f"add_to_cart: items[{n}] must be an object with an id and a qty, not {item!r}")
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id:
            raise FixableError(f"add_to_cart: items[{n}].id must be a product id such as 'sku-001', not {item_id!r}")
        qty = item.get("qty", 1)
        if isinstance(qty, float) and qty.is_integer():
            qty = int(qty)  # 2.0 from a JSON encoder means 2
        if isinstance(qty, bool) or not isinstance(qty, int) or not 1 <= qty <= MAX_QTY:
            raise FixableError(f"add_to_cart: items[{n}].qty must be a whole number from 1 to {MAX_QTY}, not {qty!r}")
        if item_id not in catalog.BY_ID:
            unknown.append(f"items[{n}].id {item_id!r}")
            continue
        qty_by_id[item_id] = qty_by_id.get(item_id, 0) + qty
        if qty_by_id[item_id] > MAX_QTY:
            raise FixableError(f"add_to_cart: {item_id} is listed more than once and its qty adds up to "
                               f"{qty_by_id[item_id]} (items[{n}].qty); at most {MAX_QTY} of one item")
    if unknown:
        raise FixableError(f"add_to_cart: no such items ({', '.join(unknown)}); which product did you mean?")
    return sorted(qty_by_id.items())


def _ask_user(args: dict[str, Any]) -> Any:
    """Ask the person; the first time the run parks, on replay the stored reply is the result."""
    question = str(args.get("question", "")).strip() or "Could you tell me more?"
    return {"reply": context.ask_user(question)}


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool("item_search", _item_search, read_only=True),
        Tool("compare", _compare, read_only=True),
        Tool("add_to_cart", _add_to_cart, read_only=False),
        Tool("ask_user", _ask_user, read_only=False),
    )
}

