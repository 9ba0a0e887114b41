"""An OpenAI Agents SDK agent as a fenced program: each model turn (one model response and the tool calls it
asks for) is one fenced step.

`FencedOpenAIAgent(agent, name=..., effects={...})` wraps an existing `agents.Agent` (PyPI `openai-agents`,
tested on 0.24) without changing it. Each delivery runs one SDK turn with the SDK's own runner,
`Runner.run(agent, input_list, max_turns=1)`; the SDK ends the delivery itself, with `MaxTurnsExceeded`
before its second model call, and the turn's items are what its run data hold. The checkpoint is the SDK's
input list (what `RunResult.to_input_list()` gives: the user's input, the model's output items and the tool
outputs, in the Responses format the SDK sends the model):

    model response -> checkpoint A (the ModelResponse's output items, as the SDK's pydantic types, and usage)
    tool calls     -> effects through tasks.context.once; ask_user parks
    turn over      -> checkpoint B (the turn's new input items), or the terminal write on a final output

A resume from checkpoint A hands the recorded response back instead of asking the model again (a `Model`
wrapper given to the SDK as `RunConfig.model`); from B, the next turn starts from the input list so far.
Function tools named in `effects` run once per (run, tool, arguments) through `tasks.context.once`; every
other tool is read-only and runs again when a step is replayed. A tool that calls `tasks.context.ask_user`
parks the run. openai-agents is an optional extra (`pip install 'fenced[openai-agents]'`): importing this
module needs it (it installs as the top-level package `agents`), importing `fenced_agents` does not.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from agents import (
    Agent,
    FunctionTool,
    ItemHelpers,
    MaxTurnsExceeded,
    Model,
    ModelResponse,
    RunConfig,
    Runner,
    ToolExecutionConfig,
    Usage,
)
from agents.items import TResponseOutputItem
from openai import APIConnectionError, APIStatusError
from openai.types.responses import ResponseFunctionToolCall
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from fenced_agents import bounds
from fenced_agents.wrapped import WrappedAgent, WrappedStep, thread_loop
from fenced_core.errors import StepError, TerminalError, TransientError
from tasks import context

if TYPE_CHECKING:
    from agents import ModelSettings, ModelTracing, Tool
    from agents.agent_output import AgentOutputSchemaBase
    from agents.handoffs import Handoff
    from agents.items import TResponseInputItem, TResponseStreamEvent
    from agents.tool_context import ToolContext
    from openai.types.responses.response_prompt_param import ResponsePromptParam

    from tasks.step import Outcome, StepRunner

_OUTPUT = TypeAdapter(list[TResponseOutputItem])


class FencedOpenAIAgent(WrappedAgent):
    """A registered fenced program that runs `agent` one model turn (a response and its tool calls) per step.

    Under a crash or a takeover: a step whose response reached checkpoint A is replayed from it (the model is
    not paid again; read-only tools run again, effects return their first result); a step that had not is
    run again from checkpoint B of the step before (that lost model call is the platform's, never billed).
    A holder that was fenced out writes nothing: its checkpoint, effect and terminal writes are refused.

    A runaway stops as our own agents do (fenced_agents.bounds.check, before each new model call: `max_steps`
    and the run's billing hold, estimated with the call's `ModelSettings.max_tokens`, or
    bounds.DEFAULT_MAX_TOKENS when none is set)."""

    def __init__(self, agent: Agent[Any], *, name: str | None = None, effects: Iterable[str] = (),
                 version: str = "", context: Callable[[context.RunContext], Any] | None = None,
                 max_steps: int | None = 8, run_config: RunConfig | None = None) -> None:
        self.agent = agent
        self.context = context
        # Tracing is the SDK's: off unless the caller's run config turns it on (it exports to OpenAI).
        self.run_config = run_config if run_config is not None else RunConfig(tracing_disabled=True)
        super().__init__("FencedOpenAIAgent", "Agent", name or agent.name or "", effects=effects, version=version,
                         max_steps=max_steps, tools_are="function tools",
                         known_tools=frozenset(t.name for t in agent.tools if isinstance(t, FunctionTool)))
        if agent.handoffs:
            raise ValueError(f"agent {self.name!r} has handoffs: FencedOpenAIAgent runs one agent (a handoff would "
                             "change the agent between steps, which the checkpoint does not record)")
        self.register()

    # -- the program ---------------------------------------------------------------------------------
    def run_step(self, runner: StepRunner) -> Outcome:
        """One fenced step: one model response (or its recorded one) and the tool calls it asked for."""
        history = items_of(runner.history)
        start = ItemHelpers.input_to_new_input_list(runner.run.query) if not history else []
        loop = thread_loop()
        step = _Step(self, runner)
        try:
            ended, new, output = loop.run_until_complete(step.run([*history, *start]))
        except BaseException as exc:
            if step.escaped is not None and step.escaped is not exc:
                raise step.escaped from exc  # ours (a park, a fence, a step error), whatever the SDK made of it
            if isinstance(exc, StepError) or not isinstance(exc, Exception):
                raise
            raise TerminalError(f"agent {self.name!r}: openai-agents raised {exc!r}") from exc
        if step.escaped is not None:
            raise step.escaped  # the SDK swallowed it (a tool's error policy): still ours
        record = {"step": runner.step, "name": step.name(), "text": step.text(), "tool_calls": step.calls,
                  "items": to_jsonable_python([*start, *new])}
        if ended:
            answer = output if isinstance(output, str) else json.dumps(to_jsonable_python(output), ensure_ascii=False)
            return runner.finish(record, answer)
        return runner.step_done(record, step.name())


def items_of(history: list[dict[str, Any]]) -> list[TResponseInputItem]:
    """The SDK input list a run's checkpoint holds (the finished steps' items, in order): the input of the next
    turn, as `RunResult.to_input_list()` would give it."""
    return [item for record in history for item in record.get("items", [])]


def response_to_json(response: ModelResponse) -> dict[str, Any]:
    """A ModelResponse as checkpoint A stores it: the output items as the SDK's (openai's) pydantic types dump them."""
    u = response.usage
    return {"output": _OUTPUT.dump_python(response.output, mode="json"), "response_id": response.response_id,
            "usage": {"requests": u.requests, "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                      "total_tokens": u.total_tokens}}


def response_from_json(data: dict[str, Any]) -> ModelResponse:
    """The ModelResponse checkpoint A recorded, validated back into the SDK's types."""
    return ModelResponse(output=_OUTPUT.validate_python(data["output"]), usage=Usage(**data["usage"]),
                         response_id=data.get("response_id"))


def _calls(response: ModelResponse) -> list[dict[str, Any]]:
    return [{"id": o.call_id, "name": o.name, "args": _args(o.arguments)}
            for o in response.output if isinstance(o, ResponseFunctionToolCall)]


def _args(raw: str) -> Any:
    try:
        return json.loads(raw or "{}")
    except ValueError:
        return raw


class _Step(WrappedStep):
    """The state of one fenced step while the SDK's runner runs its one turn."""

    def __init__(self, fa: FencedOpenAIAgent, runner: StepRunner) -> None:
        super().__init__(fa, runner)
        self.fa = fa
        self.response: ModelResponse | None = None
        self.escaped: BaseException | None = None  # the first of our exceptions raised inside the SDK

    async def run(self, items: list[TResponseInputItem]) -> tuple[bool, list[TResponseInputItem], Any]:
        """One SDK turn from `items`: (ended, the turn's new input items, the final output if ended)."""
        fa, runner = self.fa, self.runner
        agent = fa.agent.clone(tools=[self._tool(t) for t in fa.agent.tools])
        run_config = dataclasses.replace(
            fa.run_config, model=_FencedModel(self, _inner_model(fa.agent, fa.run_config)),
            tool_execution=ToolExecutionConfig(max_function_tool_concurrency=1))  # effects in the model's order
        if runner.step > 0:  # the SDK runs input guardrails on a run's first turn: fenced's step 0
            agent = agent.clone(input_guardrails=[])
            run_config = dataclasses.replace(run_config, input_guardrails=None)
        ctx = fa.context(context.current()) if fa.context else None
        try:
            result = await Runner.run(agent, items, context=ctx, max_turns=1, run_config=run_config)
        except MaxTurnsExceeded as exc:  # the turn is over: the SDK stopped before its next model call
            data = exc.run_data
            if data is None or self.response is None:
                raise
            return False, [item.to_input_item() for item in data.new_items], None
        if result.interruptions:
            names = [getattr(i, "name", None) or type(i).__name__ for i in result.interruptions]
            raise TerminalError(f"agent {fa.name!r} stopped for approval of {names}: the SDK's human-in-the-loop "
                                "(needs_approval, RunState.approve/reject) is not supported by FencedOpenAIAgent; "
                                "call tasks.context.ask_user inside the tool to wait for a person")
        return True, result.to_input_list()[len(items):], result.final_output

    def text(self) -> str:
        if self.response is None:
            return ""
        return "".join(ItemHelpers.extract_text(o) or "" for o in self.response.output)

    def _tool(self, tool: Tool) -> Tool:
        """A function tool run inside the run's context (an effect once); any other tool as it is."""
        if not isinstance(tool, FunctionTool):
            return tool
        wrapped = copy.copy(tool)  # the copy's invoker (and its error policy) is bound to the copy
        wrapped.on_invoke_tool = self._invoker(tool.name, wrapped.on_invoke_tool)
        return wrapped

    def _invoker(self, name: str, invoke: Callable[[ToolContext[Any], str], Awaitable[Any]]) -> Any:
        async def on_invoke_tool(tctx: ToolContext[Any], raw: str) -> Any:
            try:
                return await self.tool(name, invoke, tctx, raw)
            except BaseException as exc:
                if self.escaped is None:
                    self.escaped = exc
                raise
        return on_invoke_tool

    async def tool(self, name: str, invoke: Callable[[ToolContext[Any], str], Awaitable[Any]],
                   tctx: ToolContext[Any], raw: str) -> Any:
        """One tool call: an effect once per (run, tool, arguments), a read-only tool every time."""
        runner = self.runner
        args = _args(raw)
        rctx = self.tool_started(tctx.tool_call_id, name, args)
        if name not in self.fa.effects:
            with context.running(rctx):
                result = await invoke(tctx, raw)
        else:
            loop = asyncio.get_running_loop()

            async def in_context() -> Any:
                with context.running(rctx):
                    return await invoke(tctx, raw)

            def perform(_key: str) -> Any:  # inside the once-only transaction, on a thread of its own
                value = asyncio.run_coroutine_threadsafe(in_context(), loop).result()
                return to_jsonable_python(value, fallback=str)

            def attempt() -> Any:
                with context.running(rctx):
                    return context.once(name, args, perform)

            result = await asyncio.to_thread(runner.with_retries, f"tool {name}", attempt)
        self.tool_done(tctx.tool_call_id, name, to_jsonable_python(result, fallback=str))
        return result

    async def model_response(self, get: Callable[[], Awaitable[ModelResponse]], tools: set[str],
                             max_tokens: int | None) -> ModelResponse:
        """Checkpoint A around the step's one model call; a replay returns the recorded response."""
        runner, fa = self.runner, self.fa
        if self.response is not None:
            raise TerminalError(f"agent {fa.name!r} asked the model twice in step {runner.step}: a fenced step "
                                "is one model turn")
        if runner.decision is not None:
            response = response_from_json(runner.decision["response"])
            self.replaying({c["name"] for c in _calls(response)}, tools)
            self.response = response
            return response
        bounds.check(runner, fa.name, fa.max_steps, bounds.DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens)
        self.calling()
        loop = asyncio.get_running_loop()
        active = context.current()

        async def once() -> ModelResponse:
            with context.running(active):
                try:
                    return await get()
                except APIStatusError as exc:
                    if exc.status_code == 429 or exc.status_code >= 500:
                        raise TransientError(f"model answered {exc.status_code}: {exc}") from exc
                    raise TerminalError(f"model refused the request ({exc.status_code}): {exc}") from exc
                except APIConnectionError as exc:
                    raise TransientError(f"model unreachable: {exc}") from exc

        paid: ModelResponse = await asyncio.to_thread(
            runner.with_retries, "model", lambda: asyncio.run_coroutine_threadsafe(once(), loop).result())
        self.response = paid
        self.called(paid.usage.input_tokens, paid.usage.output_tokens, _calls(paid), self.text(),
                    response_to_json(paid))
        return paid


def _inner_model(agent: Agent[Any], run_config: RunConfig) -> Model:
    """The model the SDK would have used: the run config's, else the agent's, resolved by the provider."""
    chosen = run_config.model if run_config.model is not None else agent.model
    if isinstance(chosen, Model):
        return chosen
    return run_config.model_provider.get_model(chosen)


class _FencedModel(Model):
    """The model the SDK runs a step with: checkpoint A (record, or replay) around the real one's response."""

    def __init__(self, step: _Step, inner: Model) -> None:
        self.step = step
        self.inner = inner

    async def get_response(self, system_instructions: str | None, input: str | list[TResponseInputItem],
                           model_settings: ModelSettings, tools: list[Tool],
                           output_schema: AgentOutputSchemaBase | None, handoffs: list[Handoff],
                           tracing: ModelTracing, *, previous_response_id: str | None,
                           conversation_id: str | None, prompt: ResponsePromptParam | None) -> ModelResponse:
        def get() -> Awaitable[ModelResponse]:
            return self.inner.get_response(system_instructions, input, model_settings, tools, output_schema, handoffs,
                                           tracing, previous_response_id=previous_response_id,
                                           conversation_id=conversation_id, prompt=prompt)

        names = {t.name for t in tools}
        if output_schema is not None:
            names |= {"final_output"}
        try:
            return await self.step.model_response(get, names, model_settings.max_tokens)
        except BaseException as exc:
            if self.step.escaped is None:
                self.step.escaped = exc
            raise

    async def stream_response(self, system_instructions: str | None, input: str | list[TResponseInputItem],
                              model_settings: ModelSettings, tools: list[Tool],
                              output_schema: AgentOutputSchemaBase | None, handoffs: list[Handoff],
                              tracing: ModelTracing, *, previous_response_id: str | None,
                              conversation_id: str | None, prompt: ResponsePromptParam | None,
                              ) -> AsyncIterator[TResponseStreamEvent]:
        raise TerminalError("FencedOpenAIAgent runs the SDK without streaming (Runner.run); run_streamed is not "
                            "supported")
        yield  # pragma: no cover - makes this an async generator, as the interface is
