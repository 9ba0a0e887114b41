"""A pydantic-ai agent defined outside the package and wrapped for fenced (the tests' `pai_shop`).

Its model is pydantic-ai's FunctionModel: step 0 looks an item up (read-only), step 1 charges for it (an
effect), step 2 answers; "[pay-first]" swaps the first two steps, "[ask]" first asks the person which size
(the run parks). It counts, in Redis, each model call per (run, step) and each charge per run, where the
runtime never writes."""

from __future__ import annotations

import os
import time

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
