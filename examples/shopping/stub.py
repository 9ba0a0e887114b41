"""The deterministic stub model: fixed latency and token usage per step, a fixed four-step plan.

planner -> item_search -> compare (adds to cart when the user asks to buy) -> shopping_summary.
Test markers in the query drive the other paths, only with FENCED_FAULTS_ENABLED (tests and chaos):
"[transient:N]" fails the first N calls of a step, "[terminal]" fails at step 1, "[poison]" kills its own
process at step 1, "[ask]" asks the person at step 1, "[fixable]" asks for an unknown item at step 1
until a person replied.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import uuid
from typing import Any

from examples.shopping.settings import get_shopping_settings
from fenced import TerminalError, TransientError
from fenced.models import AgentContext, Decision, ToolCall
from fenced.testing import count_paid_call, faults_enabled

STEPS = ("planner", "item_search", "compare", "shopping_summary")
_CART_WORDS = ("buy", "cart", "order", "purchase")
_calls: dict[tuple[str, int], int] = {}
_calls_lock = threading.Lock()


def wants_cart(query: str) -> bool:
    return any(w in query.lower() for w in _CART_WORDS)


def _call_id() -> str:
    # Like a real provider: a fresh id per call; replays reuse the id recorded in checkpoint A.
    return f"call_{uuid.uuid4().hex[:20]}"


def _result(ctx: AgentContext, step: int, tool: str) -> Any:
    """The result of the named tool's call in an earlier step, or None."""
    h = ctx.history[step]
    return next((h["results"][c["id"]] for c in h["tool_calls"] if c["name"] == tool), None)


class StubModel:
    """Plays the shopping assistant without a provider; sleeps FENCED_STUB_STEP_MS per call."""

    def __init__(self, step_ms: int | None = None, tokens: int | None = None) -> None:
        s = get_shopping_settings()
        self.step_ms = s.stub_step_ms if step_ms is None else step_ms
        self.tokens = s.stub_tokens if tokens is None else tokens
        self.count_paid = s.stub_count_paid
        # The test markers ([poison] kills its own worker) are live only where fault points are: in the
        # test suite and chaos runs (FENCED_FAULTS_ENABLED), never in a demo or deployment.
        self.markers = faults_enabled()

    def decide(self, ctx: AgentContext) -> Decision:
        self._misbehave(ctx)
        if self.step_ms:
            time.sleep(self.step_ms / 1000)
        # The provider bills a call once it answers: counted where the runtime never writes, so the
        # history checker can hold the run's recorded calls against what was paid.
        if self.count_paid:
            count_paid_call(ctx.run_id, ctx.epoch, ctx.step)
        tokens = self.tokens * (3 if ctx.kind == "large" else 1)
        prompt = tokens * 3 // 4
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": tokens - prompt}
        name = STEPS[min(ctx.step, len(STEPS) - 1)]
        if ctx.step == 0:
            return Decision(name, f"Plan: search the catalog for '{ctx.query}', compare, then summarise.",
                            [ToolCall(_call_id(), "item_search", {"query": ctx.query, "limit": 5})], **usage)
        if ctx.step == 1:
            found = _result(ctx, 0, "item_search")
            ids = [i["id"] for i in found[:3]]
            calls = [ToolCall(_call_id(), "compare", {"item_ids": ids})]
            if self.markers and "[ask]" in ctx.query:
                calls.insert(0, ToolCall(_call_id(), "ask_user", {"question": "Any preferred brand?"}))
            if self.markers and "[fixable]" in ctx.query and not ctx.replies:
                calls = [ToolCall(_call_id(), "add_to_cart", {"items": [{"id": "sku-999"}]})]
            return Decision(name, f"Found {len(found)} candidates; comparing the top {len(ids)}.", calls, **usage)
        if ctx.step == 2:
            best = _result(ctx, 1, "compare")["best"]
            calls = []
            if wants_cart(ctx.query):
                calls = [ToolCall(_call_id(), "add_to_cart", {"items": [{"id": best["id"], "qty": 1}]})]
            return Decision(name, f"{best['name']} is the best value.", calls, **usage)
        best = _result(ctx, 1, "compare")["best"]
        card = _result(ctx, 2, "add_to_cart")
        asked = _result(ctx, 1, "ask_user")
        answer = f"I recommend the {best['name']} at ${best['price_cents'] / 100:.2f} (rated {best['rating']})."
        if card:
            answer += f" It is in your cart for confirmation (card {card['card_id']})."
        if asked:
            answer += f" You told me: {asked['reply']!r}."
        return Decision(name, answer, [], final=True, answer=answer, **usage)

    def _misbehave(self, ctx: AgentContext) -> None:
        if not self.markers:
            return
        q = ctx.query
        if "[poison]" in q and ctx.step == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if "[terminal]" in q and ctx.step == 1:
            raise TerminalError("the stub model refuses this request ([terminal] marker)")
        m = re.search(r"\[transient:(\d+)\]", q)
        if m:
            with _calls_lock:
                n = _calls[(ctx.run_id, ctx.step)] = _calls.get((ctx.run_id, ctx.step), 0) + 1
            if n <= int(m.group(1)):
                raise TransientError(f"stub provider overloaded (call {n} of step {ctx.step})")
