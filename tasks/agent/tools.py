"""The demo agent's tools: read-only ones rerun on replay, the effect hits its idempotency key."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkpoints.effects import create_cart_card
from checkpoints.runs import Claim
from fenced.errors import TerminalError
from tasks.agent import catalog


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[[Claim, dict[str, Any]], Any]
    read_only: bool


def _item_search(_c: Claim, args: dict[str, Any]) -> Any:
    return catalog.search(str(args.get("query", "")), int(args.get("limit", 5)))


def _compare(_c: Claim, args: dict[str, Any]) -> Any:
    ids = list(args.get("item_ids", []))
    missing = [i for i in ids if i not in catalog.BY_ID]
    if missing:
        raise TerminalError(f"compare: unknown item ids {missing}")
    items = [catalog.BY_ID[i] for i in ids]
    # Best value: rating per dollar, rating breaks ties.
    ranked = sorted(items, key=lambda i: (-(i["rating"] / (i["price_cents"] / 100)), -i["rating"], i["id"]))
    return {"ranked": [i["id"] for i in ranked], "best": ranked[0] if ranked else None}


def _add_to_cart(c: Claim, args: dict[str, Any]) -> Any:
    items = [{**catalog.BY_ID[i["id"]], "qty": int(i.get("qty", 1))} for i in args.get("items", [])]
    if not items:
        raise TerminalError("add_to_cart: no items")
    card = create_cart_card(c, items)
    return {"card_id": card.card_id, "total_cents": card.total_cents, "reused": card.reused}


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool("item_search", _item_search, read_only=True),
        Tool("compare", _compare, read_only=True),
        Tool("add_to_cart", _add_to_cart, read_only=False),
    )
}


def run_tool(c: Claim, name: str, args: dict[str, Any]) -> Any:
    tool = TOOLS.get(name)
    if tool is None:
        raise TerminalError(f"the model asked for an unknown tool {name!r}")
    return tool.fn(c, args)
