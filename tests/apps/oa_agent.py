"""An OpenAI Agents SDK agent defined outside the package and wrapped for fenced (the tests' `oa_shop`).

Its model is an `agents.models.interface.Model` of its own (no network): turn 0 looks an item up
(read-only), turn 1 charges for it (an effect), turn 2 answers; "[pay-first]" swaps the first two turns,
"[ask]" first asks the person which size (the run parks). It counts, in Redis, each model call per
(run, step) and each charge per run, where the runtime never writes."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from agents import (
    Agent,
    GuardrailFunctionOutput,
    Model,
    ModelResponse,
    ModelSettings,
    Usage,
    function_tool,
    input_guardrail,
)
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from fenced.openai_agents import FencedOpenAIAgent
from fencing.connection import get_redis
from fencing.metering import count_paid_call
from tasks import context


def model_calls_key(run_id: str) -> str:
    return f"test:oa:model_calls:{run_id}"


def charges_key(run_id: str) -> str:
    return f"test:oa:charges:{run_id}"


def guards_key(run_id: str) -> str:
    return f"test:oa:guards:{run_id}"


def _prompt(items: Any) -> str:
    if isinstance(items, str):
        return items
    for item in items:
        if isinstance(item, dict) and item.get("role") == "user" and isinstance(item.get("content"), str):
            return str(item["content"])
    return ""


def _call(name: str, args: dict[str, Any], n: int) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(type="function_call", call_id=f"call_{n}_{name}", name=name,
                                    arguments=json.dumps(args), id=f"fc_{n}", status="completed")


def _text(text: str, n: int) -> ResponseOutputMessage:
    return ResponseOutputMessage(type="message", id=f"msg_{n}", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", text=text, annotations=[])])


class ShopModel(Model):
    """The tests' model: a plan per prompt, one turn per answer it has already given."""

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,
                           output_schema: Any, handoffs: Any, tracing: Any, *, previous_response_id: Any = None,
                           conversation_id: Any = None, prompt: Any = None) -> ModelResponse:
        ctx = context.current()
        get_redis().hincrby(model_calls_key(ctx.run_id), str(ctx.step), 1)
        count_paid_call(ctx.run_id, ctx.epoch, ctx.step)
        time.sleep(float(os.environ.get("OA_STEP_MS", "0")) / 1000)
        items = [] if isinstance(input, str) else input
        answered = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output")
        text = _prompt(input)
        plan: list[str | None] = ["charge", "lookup", None] if "[pay-first]" in text else ["lookup", "charge", None]
        if "[ask]" in text:
            plan = ["ask_size", *plan]
        tool = plan[answered] if answered < len(plan) else None
        usage = Usage(requests=1, input_tokens=50, output_tokens=10, total_tokens=60)
        if tool == "lookup":
            output: list[Any] = [_call("lookup", {"item": "desk lamp"}, answered)]
        elif tool == "charge":
            output = [_text("buying it", answered), _call("charge", {"item": "desk lamp", "cents": 2599}, answered)]
        elif tool == "ask_size":
            output = [_call("ask_size", {"question": "Which size?"}, answered)]
        else:
            output = [_text("Bought a desk lamp for 25.99.", answered)]
        return ModelResponse(output=output, usage=usage, response_id=None)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError
        yield


@function_tool
def lookup(item: str) -> dict:
    """Find an item in the catalog (read-only)."""
    return {"item": item, "cents": 2599}


@function_tool
def charge(item: str, cents: int) -> dict:
    """Charge the user's card for an item (an effect: once per run and arguments)."""
    n = get_redis().incr(charges_key(context.current().run_id))
    return {"charged": cents, "item": item, "charge_no": n}


@function_tool
def ask_size(question: str) -> str:
    """Ask the person a question; the run waits for the reply."""
    return context.ask_user(question)


@input_guardrail(run_in_parallel=False)
def count_guard(ctx: Any, agent: Any, input: Any) -> GuardrailFunctionOutput:
    """An input guardrail that lets everything through and counts its runs (the SDK runs it on a run's first turn)."""
    get_redis().incr(guards_key(context.current().run_id))
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered=False)


# OA_DROP_CHARGE=1: a later version of the agent that no longer has the tool (a replay must refuse it).
DROP_CHARGE = os.environ.get("OA_DROP_CHARGE") == "1"
# OA_UNGUARDED=1: the charge is not declared an effect (the guard a test breaks to see the promise fail).
UNGUARDED = os.environ.get("OA_UNGUARDED") == "1"

shop = Agent(name="oa_shop", instructions="Buy what the user asks for.", model=ShopModel(),
             tools=[lookup, ask_size] if DROP_CHARGE else [lookup, charge, ask_size],
             model_settings=ModelSettings(max_tokens=100), input_guardrails=[count_guard])

oa_shop = FencedOpenAIAgent(shop, effects=set() if DROP_CHARGE or UNGUARDED else {"charge"},
                            version="2" if DROP_CHARGE else "1")
# The same agent allowed one step: a run that has not answered by then stops (failed, max_steps).
oa_short = FencedOpenAIAgent(shop, name="oa_short", effects=set() if DROP_CHARGE else {"charge"}, max_steps=1)


class RunawayModel(Model):
    """A model that never answers: it looks the item up again and again, each call `usage` tokens (in, out)."""

    def __init__(self, usage: tuple[int, int]) -> None:
        self.usage = usage

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        ctx = context.current()
        get_redis().hincrby(model_calls_key(ctx.run_id), str(ctx.step), 1)
        count_paid_call(ctx.run_id, ctx.epoch, ctx.step)
        i, o = self.usage
        return ModelResponse(output=[_call("lookup", {"item": "desk lamp"}, ctx.step)],
                             usage=Usage(requests=1, input_tokens=i, output_tokens=o, total_tokens=i + o),
                             response_id=None)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError
        yield


# Runaways for the bounds (fenced_agents.bounds): one at the default max_steps (8); one that spends 1200
# tokens a call against the 20-credit hold (5 credits per 1k tokens) with calls of up to 2500 tokens.
oa_runaway = FencedOpenAIAgent(Agent(name="oa_runaway", model=RunawayModel((10, 5)), tools=[lookup]))
oa_spender = FencedOpenAIAgent(Agent(name="oa_spender", model=RunawayModel((900, 300)), tools=[lookup],
                                     model_settings=ModelSettings(max_tokens=2500)), max_steps=50)


@function_tool(needs_approval=True)
def delete_account(user: str) -> str:
    """Delete a user's account (needs a person's approval)."""
    return f"deleted {user}"


class ApproveModel(Model):
    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        ctx = context.current()
        count_paid_call(ctx.run_id, ctx.epoch, ctx.step)
        return ModelResponse(output=[_call("delete_account", {"user": "u1"}, 0)],
                             usage=Usage(requests=1, input_tokens=5, output_tokens=5, total_tokens=10),
                             response_id=None)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError
        yield


# The SDK's human-in-the-loop (needs_approval): not supported, the run must fail clearly.
oa_approve = FencedOpenAIAgent(Agent(name="oa_approve", model=ApproveModel(), tools=[delete_account]))
