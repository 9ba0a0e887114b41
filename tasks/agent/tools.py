"""The demo agent's tools: read-only ones rerun on replay, the effect hits its idempotency key."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkpoints import inputs
from checkpoints.effects import create_cart_card
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
    unknown = [i.get("id") for i in args.get("items", []) if i.get("id") not in catalog.BY_ID]
    if unknown:
        raise FixableError(f"add_to_cart: no such items {unknown}; which product did you mean?")
    items = [{**catalog.BY_ID[i["id"]], "qty": int(i.get("qty", 1))} for i in args.get("items", [])]
    if not items:
        raise TerminalError("add_to_cart: no items")
    card = create_cart_card(t.claim, items)
    return {"card_id": card.card_id, "total_cents": card.total_cents, "reused": card.reused}


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
