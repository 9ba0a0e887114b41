"""A pydantic-ai agent as a fenced program: each model request and the tool calls it asks for are one fenced step.

`FencedAgent(agent, name=..., effects={...})` wraps an existing `pydantic_ai.Agent` without changing it, the
way pydantic-ai's own durable integrations do: through its public capability hooks, run by `Agent.iter` node by
node. The checkpoint is the message history, serialised with pydantic-ai's `ModelMessagesTypeAdapter`:

    model request -> checkpoint A (the response and its usage) -> tool calls -> checkpoint B (the new messages)

A resume from checkpoint A hands the recorded response back instead of asking the model again; from B, the
next request is sent with the history so far. Tools named in `effects` run once per (run, tool, arguments)
through `tasks.context.once`; every other tool is read-only and runs again when a step is replayed. A tool
that calls `tasks.context.ask_user` parks the run until a person replies. Before each request is sent, the
run is bounded as our own agents are (fenced_agents.bounds: `max_steps` and the billing hold, the request's
`max_tokens` being the estimate). pydantic-ai is an optional extra
(`pip install 'fenced[pydantic-ai]'`): importing this module needs it, importing `agents` does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio.from_thread
import anyio.to_thread
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.agent import ModelRequestNode
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ModelAPIError, ModelHTTPError
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import merge_model_settings
from pydantic_ai.toolsets import FunctionToolset
from pydantic_core import to_jsonable_python
from pydantic_graph import End

from fenced_agents import bounds
from fenced_agents.wrapped import WrappedAgent, WrappedStep, thread_loop
from fenced_core.errors import StepError, TerminalError, TransientError
from tasks import context

if TYPE_CHECKING:
    from pydantic_ai.models import Model, ModelRequestParameters
    from pydantic_ai.settings import ModelSettings

    from tasks.step import Outcome, StepRunner

class FencedAgent(WrappedAgent):
    """A registered fenced program that runs `agent` one model request (and its tool calls) per step.

    Under a crash or a takeover: a step whose response reached checkpoint A is replayed from it (the model is
    not paid again; read-only tools run again, effects return their first result); a step that had not is
    run again from checkpoint B of the step before (that lost model call is the platform's, never billed).
    A holder that was fenced out writes nothing: its checkpoint, effect and terminal writes are refused.

    A runaway stops as our own agents do (fenced_agents.bounds.check, made before each model request that is
    sent, never before a replayed one): at step `max_steps` (default 8, as `fenced.Agent`; None: no limit) the
    run fails with class `max_steps`, and a request whose worst case (the run's recorded usage plus the
    request's `max_tokens` from its model settings, or bounds.DEFAULT_MAX_TOKENS when they set none) the
    billing hold cannot cover is not sent: the run fails with class `budget`. Either way it is settled at
    most its hold, with the reason in the ledger. A new holder after a crash or a takeover checks against
    the step and usage the checkpoints recorded, so it applies the same bounds."""

    def __init__(self, agent: Agent[Any, Any], *, name: str | None = None, effects: Iterable[str] = (),
                 version: str = "", deps: Callable[[context.RunContext], Any] | None = None,
                 max_steps: int | None = 8) -> None:
        self.agent = agent
        self.deps = deps
        super().__init__("FencedAgent", "pydantic-ai Agent", name or agent.name or "", effects=effects,
                         version=version, max_steps=max_steps, known_tools=_function_tool_names(agent))
        self.register()

    # -- the program ---------------------------------------------------------------------------------
    def run_step(self, runner: StepRunner) -> Outcome:
        """One fenced step: one model request (or its recorded response) and the tool calls it asked for."""
        history = messages_of(runner.history)
        prompt = None if history else runner.run.query
        loop = thread_loop()
        step = _Step(self, runner)
        try:
            with Agent.parallel_tool_call_execution_mode("sequential"):  # effects and events in the model's order
                ended, new, output = loop.run_until_complete(step.run(history, prompt))
        except StepError:
            raise
        except Exception as exc:  # pydantic-ai's own failures (UserError, UnexpectedModelBehavior, usage limits)
            raise TerminalError(f"agent {self.name!r}: pydantic-ai raised {exc!r}") from exc
        record = {"step": runner.step, "name": step.name(), "text": step.text(), "tool_calls": step.calls,
                  "messages": ModelMessagesTypeAdapter.dump_python(new, mode="json")}
        if ended and isinstance(output, DeferredToolRequests):
            raise TerminalError(f"agent {self.name!r} ended with deferred tool calls "
                                f"{[c.tool_name for c in [*output.calls, *output.approvals]]}: pydantic-ai's "
                                "deferred tools (requires_approval, CallDeferred, external tools) are not supported by "
                                "FencedAgent; call tasks.context.ask_user inside the tool to wait for a person")
        if ended:
            answer = output if isinstance(output, str) else _json_text(output)
            return runner.finish(record, answer)
        return runner.step_done(record, step.name())


def messages_of(history: list[dict[str, Any]]) -> list[ModelMessage]:
    """The pydantic-ai message history a run's checkpoint holds (the finished steps' messages, in order)."""
    raw = [m for record in history for m in record.get("messages", [])]
    return ModelMessagesTypeAdapter.validate_python(raw)


def _function_tool_names(agent: Agent[Any, Any]) -> frozenset[str] | None:
    """The agent's function tools, when every toolset is a FunctionToolset (else None: not checkable here)."""
    names: set[str] = set()
    for toolset in agent.toolsets:
        if not isinstance(toolset, FunctionToolset):
            return None
        names |= set(toolset.tools)
    return frozenset(names)


def _json_text(value: Any) -> str:
    import json

    return json.dumps(to_jsonable_python(value), ensure_ascii=False)


def _passes_through(exc: BaseException) -> bool:
    """pydantic-ai's own control flow (ModelRetry, CallDeferred, ...) is its business, not a failed tool."""
    return type(exc).__module__.startswith(("pydantic_ai", "pydantic_graph"))


@dataclass
class _Passed:
    exc: BaseException


class _Step(WrappedStep):
    """The state of one fenced step while pydantic-ai's graph runs it."""

    def __init__(self, fa: FencedAgent, runner: StepRunner) -> None:
        super().__init__(fa, runner)
        self.fa = fa
        self.response: ModelResponse | None = None

    async def run(self, history: list[ModelMessage], prompt: str | None) -> tuple[bool, list[ModelMessage], Any]:
        """Drive the graph to the end of this step: (ended, the step's new messages, the output if ended)."""
        runner = self.runner
        deps = self.fa.deps(context.current()) if self.fa.deps else None
        async with self.fa.agent.iter(prompt, message_history=history, deps=deps,
                                      capabilities=[_FencedCapability(self)]) as run:
            node: Any = run.next_node
            while True:
                node = await run.next(node)
                runner.boundary()
                if isinstance(node, End):
                    output = run.result.output if run.result is not None else node.data
                    return True, run.all_messages()[len(history):], output
                if isinstance(node, ModelRequestNode) and self.response is not None:
                    # The tools answered; the next request (their results) is the next step's to send.
                    return False, [*run.all_messages()[len(history):], node.request], None

    def text(self) -> str:
        if self.response is None:
            return ""
        return "".join(p.content for p in self.response.parts if isinstance(p, TextPart))

    async def model_request(self, handler: Callable[[], Any], tools: set[str]) -> ModelResponse:
        """Checkpoint A around the step's one model request; a replay returns the recorded response."""
        runner = self.runner
        if self.response is not None:
            raise TerminalError(f"agent {self.fa.name!r} asked the model twice in step {runner.step}: a fenced step "
                                "is one model request and its tool calls")
        if runner.decision is not None:
            response = ModelMessagesTypeAdapter.validate_python([runner.decision["response"]])[0]
            if not isinstance(response, ModelResponse):
                raise TerminalError(f"checkpoint A of step {runner.step} holds no model response: {response!r}")
            self.replaying({p.tool_name for p in response.parts if isinstance(p, ToolCallPart)}, tools)
            self.response = response
            return response
        self.calling()
        response = await handler()
        self.response = response
        calls: list[dict[str, Any]] = [{"id": p.tool_call_id, "name": p.tool_name, "args": p.args_as_dict()}
                                       for p in response.parts if isinstance(p, ToolCallPart)]
        self.called(response.usage.input_tokens, response.usage.output_tokens, calls, self.text(),
                    ModelMessagesTypeAdapter.dump_python([response], mode="json")[0])
        return response

    async def tool(self, call: ToolCallPart, run_tool: Callable[[], Any]) -> Any:
        """One tool call, inside the run's context: an effect once, a read-only tool every time."""
        runner = self.runner
        args = call.args_as_dict()
        ctx = self.tool_started(call.tool_call_id, call.tool_name, args)

        async def once_run() -> Any:
            with context.running(ctx):
                try:
                    return await run_tool()
                except Exception as exc:
                    if _passes_through(exc):
                        return _Passed(exc)
                    raise

        def attempt() -> Any:
            if call.tool_name not in self.fa.effects:
                return anyio.from_thread.run(once_run)
            with context.running(ctx):
                passed: list[_Passed] = []

                def perform(_key: str) -> Any:
                    value = anyio.from_thread.run(once_run)
                    if isinstance(value, _Passed):
                        passed.append(value)
                        raise value.exc  # nothing recorded: the model is asked again, the effect not done
                    return to_jsonable_python(value)

                try:
                    return context.once(call.tool_name, args, perform)
                except Exception:
                    if passed:
                        return passed[0]
                    raise

        result = await anyio.to_thread.run_sync(runner.with_retries, f"tool {call.tool_name}", attempt)
        if isinstance(result, _Passed):
            raise result.exc
        self.tool_done(call.tool_call_id, call.tool_name, to_jsonable_python(result, fallback=repr))
        return result


class _FencedCapability(AbstractCapability[Any]):
    """The hooks that make one `Agent.iter` run a fenced step (a run capability: the agent is not changed)."""

    def __init__(self, step: _Step) -> None:
        super().__init__()
        self.step = step

    def get_wrapper_model(self, model: Model) -> Model | None:
        return _RetryingModel(model, self.step)

    async def wrap_model_request(self, ctx: Any, *, request_context: Any, handler: Any) -> ModelResponse:
        params = request_context.model_request_parameters
        tools = {t.name for t in [*params.function_tools, *params.output_tools]}
        return await self.step.model_request(lambda: handler(request_context), tools)

    async def wrap_tool_execute(self, ctx: Any, *, call: ToolCallPart, tool_def: Any, args: Any, handler: Any) -> Any:
        return await self.step.tool(call, lambda: handler(args))


class _RetryingModel(WrapperModel):
    """The agent's model, bounded and with the runner's retry policy: a request past the run's bounds is not
    sent (fenced_agents.bounds); 429 and 5xx answers and lost connections are retried with backoff inside the
    step's budget; anything else fails the run."""

    def __init__(self, wrapped: Model, step: _Step) -> None:
        super().__init__(wrapped)
        self.step = step
        self.runner = step.runner

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        # The last point before the provider: the settings are final (the agent's, the run's and every hook's,
        # with the model's own under them, as the model merges them).
        settings = merge_model_settings(self.settings, model_settings) or {}
        max_tokens = settings.get("max_tokens")
        fa = self.step.fa
        bounds.check(self.runner, fa.name, fa.max_steps,
                     bounds.DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens))
        inner = super().request
        active = context.current()

        async def once() -> ModelResponse:
            with context.running(active):
                try:
                    return await inner(messages, model_settings, model_request_parameters)
                except ModelHTTPError as exc:
                    if exc.status_code == 429 or exc.status_code >= 500:
                        raise TransientError(f"model answered {exc.status_code}: {exc}") from exc
                    raise TerminalError(f"model refused the request ({exc.status_code}): {exc}") from exc
                except ModelAPIError as exc:
                    raise TransientError(f"model unreachable: {exc}") from exc

        response: ModelResponse = await anyio.to_thread.run_sync(
            self.runner.with_retries, "model", lambda: anyio.from_thread.run(once))
        return response
