"""The demo agent's tools: read-only ones rerun on replay, the effect hits its idempotency key."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkpoints import inputs
from checkpoints.effects import MAX_QTY, create_cart_card
from checkpoints.runs import Claim
from fenced.errors import FixableError, TerminalError, WaitForInput
from fenced.settings import get_settings
from tasks.agent import catalog


@dataclass(frozen=True)
class ToolContext:
    """What a tool may use: the holder's claim (for fenced effects), its call id and the step."""

    claim: Claim
    call_id: str
    step: int


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[[ToolContext, dict[str, Any]], Any]
    read_only: bool


def _item_search(_t: ToolContext, args: dict[str, Any]) -> Any:
    return catalog.search(str(args.get("query", "")), int(args.get("limit", 5)))


def _compare(_t: ToolContext, args: dict[str, Any]) -> Any:
    ids = list(args.get("item_ids", []))
    missing = [i for i in ids if i not in catalog.BY_ID]
    if missing:
        raise TerminalError(f"compare: unknown item ids {missing}")
    items = [catalog.BY_ID[i] for i in ids]
    # Best value: rating per dollar, rating breaks ties.
    ranked = sorted(items, key=lambda i: (-(i["rating"] / (i["price_cents"] / 100)), -i["rating"], i["id"]))
    return {"ranked": [i["id"] for i in ranked], "best": ranked[0] if ranked else None}


def _add_to_cart(t: ToolContext, args: dict[str, Any]) -> Any:
    # The card is keyed by the decision (ids and quantities); name and price are looked up now and
    # fixed on the card when it is first created.
    items = [{**catalog.BY_ID[item_id], "qty": qty} for item_id, qty in cart_request(args)]
    card = create_cart_card(t.claim, items)
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


def _ask_user(t: ToolContext, args: dict[str, Any]) -> Any:
    """Ask the person; the first time the run parks, on replay the stored reply is the result."""
    question = str(args.get("question", "")).strip() or "Could you tell me more?"
    answer = inputs.ask(t.claim, t.call_id, t.step, question)
    if answer is None:
        raise WaitForInput(question, t.call_id)
    return {"reply": answer}


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool("item_search", _item_search, read_only=True),
        Tool("compare", _compare, read_only=True),
        Tool("add_to_cart", _add_to_cart, read_only=False),
        Tool("ask_user", _ask_user, read_only=False),
    )
}


def run_tool(ctx: ToolContext, name: str, args: dict[str, Any]) -> Any:
    tool = TOOLS.get(name)
    if tool is None:
        raise TerminalError(f"the model asked for an unknown tool {name!r}")
    delay_ms = get_settings().stub_tool_ms
    if delay_ms:
        time.sleep(delay_ms / 1000)  # the demo's tools answer at once; real ones take time
    return tool.fn(ctx, args)
