"""The shopping agent's tools, plain typed functions: item_search and compare are read-only (rerun when a
step is replayed); add_to_cart offers a cart confirmation card once per decision (examples/shopping/cards.py).

Their schemas for the model come from the type hints and docstrings (fenced_agents.tools). The demo's tools
answer at once; FENCED_STUB_TOOL_MS makes each call take that long, like a real tool (chaos, bench).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from pydantic import Field, WithJsonSchema

from examples.shopping import catalog
from examples.shopping.cards import MAX_QTY, create_cart_card
from examples.shopping.settings import get_shopping_settings
from fenced import FixableError, TerminalError, current_run, tool


def _tool_latency() -> None:
    delay_ms = get_shopping_settings().stub_tool_ms
    if delay_ms:
        time.sleep(delay_ms / 1000)


@tool
def item_search(query: str, limit: Annotated[int, Field(ge=1, le=50)] = 5) -> list[dict[str, Any]]:
    """Search the catalog; the best rated matches first.

    Args:
        query: what the person is looking for, in their words.
        limit: how many items to return.
    """
    _tool_latency()
    return catalog.search(query, limit)


@tool
def compare(item_ids: list[str]) -> dict[str, Any]:
    """Rank items by value (rating per dollar, rating breaks ties); `best` is the first.

    Args:
        item_ids: catalog ids of the items to compare, such as 'sku-001'.
    """
    _tool_latency()
    missing = [i for i in item_ids if i not in catalog.BY_ID]
    if missing:
        raise TerminalError(f"compare: unknown item ids {missing}")
    items = [catalog.BY_ID[i] for i in item_ids]
    ranked = sorted(items, key=lambda i: (-(i["rating"] / (i["price_cents"] / 100)), -i["rating"], i["id"]))
    return {"ranked": [i["id"] for i in ranked], "best": ranked[0] if ranked else None}


# The schema the model is shown; the values themselves are checked by cart_request, whose FixableErrors
# name the field (items[n].qty ...) so the model, or the person, can correct them.
CART_ITEMS_SCHEMA = {
    "type": "array", "minItems": 1,
    "items": {"type": "object", "required": ["id"], "properties": {
        "id": {"type": "string", "description": "a catalog id such as 'sku-001'"},
        "qty": {"type": "integer", "minimum": 1, "maximum": MAX_QTY, "default": 1}}},
}


@tool(name="add_to_cart")
def add_to_cart(items: Annotated[Any, WithJsonSchema(CART_ITEMS_SCHEMA)] = None) -> dict[str, Any]:
    """Offer the person a cart confirmation card for these items; they confirm it to place the order.

    Safe to run again: the card is created once per run and decision (item ids and quantities), and a
    replay after a crash or a takeover returns the first card (a fresh one if that expired unconfirmed).

    Args:
        items: the items and how many of each (qty 1 to 99, default 1).
    """
    # Not an @effect: the card is its own once-only record (cards.create_cart_card, on perform_once),
    # keyed by the sorted decision and renewed when expired, written in the effect's fenced transaction.
    _tool_latency()
    # The card is keyed by the decision (ids and quantities); name and price are looked up now and
    # fixed on the card when it is first created.
    lines = [{**catalog.BY_ID[item_id], "qty": qty} for item_id, qty in cart_request({"items": items})]
    card = create_cart_card(current_run().claim, lines)
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


TOOLS = (item_search, compare, add_to_cart)
