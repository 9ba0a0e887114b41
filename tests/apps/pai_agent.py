"""A pydantic-ai agent defined outside the package and wrapped for fenced (the tests' `pai_shop`).

Its model is pydantic-ai's FunctionModel: step 0 looks an item up (read-only), step 1 charges for it (an
effect), step 2 answers; "[pay-first]" swaps the first two steps, "[ask]" first asks the person which size
(the run parks). It counts, in Redis, each model call per (run, step) and each charge per run, where the
runtime never writes. Runaways (`pai_runaway`, `pai_spender`, `pai_spender_default`) never answer: the
bounds stop them."""

from __future__ import annotations

import os
import time
from typing import Any

from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from fenced.pydantic_ai import FencedAgent
from fencing.connection import get_redis
from fencing.metering import count_paid_call
from tasks import context


def model_calls_key(run_id: str) -> str:
    return f"test:pai:model_calls:{run_id}"


def charges_key(run_id: str) -> str:
    return f"test:pai:charges:{run_id}"


def _prompt(messages: list[ModelMessage]) -> str:
    for m in messages:
        if isinstance(m, ModelRequest):
            for p in m.parts:
                if isinstance(p, UserPromptPart) and isinstance(p.content, str):
                    return p.content
    return ""


def decide(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    ctx = context.current()
    r = get_redis()
    r.hincrby(model_calls_key(ctx.run_id), str(ctx.step), 1)
    count_paid_call(ctx.run_id, ctx.epoch, ctx.step)
    time.sleep(float(os.environ.get("PAI_STEP_MS", "0")) / 1000)
    answered = sum(isinstance(m, ModelResponse) for m in messages)
    prompt = _prompt(messages)
    plan: list[str | None] = ["charge", "lookup", None] if "[pay-first]" in prompt else ["lookup", "charge", None]
    if "[ask]" in prompt:
        plan = ["ask_size", *plan]
    tool = plan[answered] if answered < len(plan) else None
    if tool == "lookup":
        return ModelResponse(parts=[ToolCallPart("lookup", {"item": "desk lamp"})])
    if tool == "charge":
        charge = ToolCallPart("charge", {"item": "desk lamp", "cents": 2599})
        return ModelResponse(parts=[TextPart("buying it"), charge])
    if tool == "ask_size":
        return ModelResponse(parts=[ToolCallPart("ask_size", {"question": "Which size?"})])
    return ModelResponse(parts=[TextPart("Bought a desk lamp for 25.99.")])


shop = Agent(FunctionModel(decide), name="pai_shop", instructions="Buy what the user asks for.")


@shop.tool_plain
def lookup(item: str) -> dict:
    """Find an item in the catalog (read-only)."""
    return {"item": item, "cents": 2599}


def charge(item: str, cents: int) -> dict:
    """Charge the user's card for an item (an effect: once per run and arguments)."""
    n = get_redis().incr(charges_key(context.current().run_id))
    return {"charged": cents, "item": item, "charge_no": n}


# PAI_DROP_CHARGE=1: a later version of the agent that no longer has the tool (a replay must refuse it).
DROP_CHARGE = os.environ.get("PAI_DROP_CHARGE") == "1"
if not DROP_CHARGE:
    shop.tool_plain(charge)


@shop.tool_plain
def ask_size(question: str) -> str:
    """Ask the person a question; the run waits for the reply."""
    return context.ask_user(question)


pai_shop = FencedAgent(shop, effects=set() if DROP_CHARGE else {"charge"}, version="2" if DROP_CHARGE else "1")
# The same agent allowed one step: a run that has not answered by then stops (failed, max_steps).
pai_short = FencedAgent(shop, name="pai_short", effects=set() if DROP_CHARGE else {"charge"}, max_steps=1)


def _runaway(name: str, usage: tuple[int, int] | None = None, **kw: Any) -> Agent[None, str]:
    """An agent that never answers: it looks the item up again and again. Each model call is counted like
    decide's; its usage is `usage` (input, output tokens), or pydantic-ai's estimate (tens of tokens) when None."""

    def run_away(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        ctx = context.current()
        get_redis().hincrby(model_calls_key(ctx.run_id), str(ctx.step), 1)
        count_paid_call(ctx.run_id, ctx.epoch, ctx.step)
        response = ModelResponse(parts=[ToolCallPart("lookup", {"item": "desk lamp"})])
        if usage is not None:
            response.usage = RequestUsage(input_tokens=usage[0], output_tokens=usage[1])
        return response

    agent = Agent(FunctionModel(run_away), name=name, **kw)
    agent.tool_plain(lookup)
    return agent


# Runaways for the bounds (fenced_agents.bounds): one with FencedAgent's default max_steps; two that spend
# 1200 tokens a call against the 20-credit hold (5 credits per 1k tokens), one whose requests may use up to
# 2500 tokens (its model_settings) and one that sets no max_tokens (estimated at bounds.DEFAULT_MAX_TOKENS).
pai_runaway = FencedAgent(_runaway("pai_runaway"))
_SPEND = (900, 300)
pai_spender = FencedAgent(_runaway("pai_spender", _SPEND, model_settings={"max_tokens": 2500}), max_steps=50)
pai_spender_default = FencedAgent(_runaway("pai_spender_default", _SPEND), max_steps=50)


def approve_first(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    ctx = context.current()
    count_paid_call(ctx.run_id, ctx.epoch, ctx.step)
    return ModelResponse(parts=[ToolCallPart("delete_account", {"user": "u1"})])


# A pydantic-ai deferred tool (requires_approval): not supported, the run must fail clearly.
approver = Agent(FunctionModel(approve_first), name="pai_approve", output_type=[str, DeferredToolRequests])


@approver.tool_plain(requires_approval=True)
def delete_account(user: str) -> str:
    """Delete a user's account (needs a person's approval)."""
    return f"deleted {user}"


pai_approve = FencedAgent(approver)
