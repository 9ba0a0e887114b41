"""A support agent as a user writes it: its own model class, three tools (one an effect), and two runaways.

The model is deterministic: step 0 looks the order up and reads the refund policy, step 1 refunds it,
step 2 answers. Each refund performed (the outside world: a payment provider would get the key) is
counted in Redis under fenced-test:refunds:<run_id> with its idempotency key, so a test can tell a
replayed effect from a repeated one. Test knobs, read from the environment of the worker:
SUPPORT_STEP_MS (model latency), SUPPORT_DROP_REFUND=1 (this release has no refund tool).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import Field

from fenced import Agent, ToolContext
from fenced.models import AgentContext, Decision, ToolCall
from fenced_core.errors import TerminalError
from fencing.connection import get_redis
from fencing.metering import count_paid_call

TOKENS = (300, 100)  # prompt, completion per model call


def _call(name: str, **args: Any) -> ToolCall:
    return ToolCall(f"call_{uuid.uuid4().hex[:16]}", name, args)


def _results(ctx: AgentContext, tool: str) -> list[Any]:
    """Every result of `tool` in the finished steps, oldest first."""
    return [h["results"][c["id"]] for h in ctx.history for c in h["tool_calls"] if c["name"] == tool]


class SupportModel:
    """Plays the support assistant. Counts each call as paid (the history checker holds the runtime's
    records against it). A query with "[badargs]" makes the first refund call with a bad amount, which
    the tool's validation sends back; the model then fixes its call. With "[ask]" it first asks the
    person which order (the built-in ask_user) and refunds the one they name."""

    max_tokens = 200

    def decide(self, ctx: AgentContext) -> Decision:
        if not ctx.instructions or "lookup_order" not in {t["name"] for t in ctx.tools}:
            raise TerminalError("the model was not shown the agent's instructions and tools")
        time.sleep(int(os.environ.get("SUPPORT_STEP_MS", "0")) / 1000)
        count_paid_call(ctx.run_id, ctx.epoch, ctx.step)
        usage: dict[str, Any] = {"prompt_tokens": TOKENS[0], "completion_tokens": TOKENS[1]}
        replies = _results(ctx, "ask_user")
        if "[ask]" in ctx.query and not replies:
            return Decision("ask", "Which order?", [_call("ask_user", question="Which order do you mean?")], **usage)
        order_id = replies[-1]["reply"] if replies else (re.findall(r"[A-Z]-\d+", ctx.query) or ["A-1001"])[0]
        orders = _results(ctx, "lookup_order")
        refunds = _results(ctx, "refund")
        if not orders:
            return Decision("lookup", f"Looking up {order_id}.", [
                _call("lookup_order", order_id=order_id), _call("refund_policy", reason="damaged")], **usage)
        done = [r for r in refunds if "refund_id" in r]
        if done:
            answer = f"Refunded {done[-1]['cents']} cents for order {order_id} ({done[-1]['refund_id']})."
            return Decision("answer", answer, [], final=True, answer=answer, **usage)
        cents: Any = orders[-1]["cents"]
        if "[badargs]" in ctx.query and not refunds:
            cents = "all of it"
        return Decision("refund", f"Refunding {order_id}.", [_call("refund", order_id=order_id, cents=cents)],
                        **usage)


support = Agent("support", model=SupportModel(), max_steps=6,
                instructions="You are a support agent. Look the order up, check the policy, refund it.")


@support.tool
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up by its id.

    Args:
        order_id: the order's id, such as A-1001.
    """
    return {"order_id": order_id, "cents": 100 * (sum(map(ord, order_id)) % 50 + 1), "status": "delivered"}


@support.tool
def refund_policy(reason: Literal["damaged", "late", "changed_mind"]) -> str:
    """What the refund policy says for a reason.

    Args:
        reason: why the customer wants their money back.
    """
    return "full refund" if reason in ("damaged", "late") else "store credit"


@support.effect("refund")
def refund(ctx: ToolContext, order_id: str, cents: Annotated[int, Field(gt=0, le=100_000)]) -> dict[str, Any]:
    """Refund an order (money leaves the shop: once per run and amount).

    Args:
        order_id: the order to refund.
        cents: the amount, in cents.
    """
    assert ctx.idempotency_key
    r = get_redis()
    r.incr(f"fenced-test:refunds:{ctx.run_id}")
    r.rpush(f"fenced-test:refund-keys:{ctx.run_id}", ctx.idempotency_key)
    return {"refund_id": f"rf_{ctx.idempotency_key[-12:]}", "order_id": order_id, "cents": cents}


if os.environ.get("SUPPORT_DROP_REFUND") == "1":
    del support.tools["refund"]  # a later release of the agent without the refund tool


class LoopingModel:
    """Never answers: looks the same order up again and again (a runaway)."""

    max_tokens = 100

    def decide(self, ctx: AgentContext) -> Decision:
        count_paid_call(ctx.run_id, ctx.epoch, ctx.step)
        return Decision("lookup", "Once more.", [_call("lookup_order", order_id="A-1001")],
                        prompt_tokens=300, completion_tokens=100)


class HungryModel(LoopingModel):
    """A runaway with long replies: each call may use up to 1500 tokens and uses 1200."""

    max_tokens = 1500

    def decide(self, ctx: AgentContext) -> Decision:
        count_paid_call(ctx.run_id, ctx.epoch, ctx.step)
        return Decision("lookup", "Thinking at length.", [_call("lookup_order", order_id="A-1001")],
                        prompt_tokens=900, completion_tokens=300)


# Several agents in one worker; a tool can serve more than one of them.
runaway = Agent("runaway", model=LoopingModel(), max_steps=3, tools=[lookup_order])
spender = Agent("spender", model=HungryModel(), max_steps=50, tools=[lookup_order])
