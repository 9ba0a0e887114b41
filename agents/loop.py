"""The agent loop as a program of the step runner: one step = one model call and the tools it asked for.

model call -> checkpoint A (the decision and its usage) -> tools -> checkpoint B (their results), or the
terminal write when the decision is final. Resuming from checkpoint A replays the recorded decision (no
model call; read-only tools rerun, effects return their first result); from B, the next model call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agents.model import AgentContext, Decision, Model
from fenced_core.errors import TerminalError
from fencing import faults
from tasks import context

if TYPE_CHECKING:
    from tasks.step import Outcome, StepRunner


@dataclass(frozen=True)
class Tool:
    """A tool as the loop calls it: `fn(args)` inside the run's context; `read_only` ones rerun on replay."""

    name: str
    fn: Callable[[dict[str, Any]], Any]
    read_only: bool


class AgentLoop:
    """The step program of an agent: `model` decides, `tools` act. Registered under `name`."""

    def __init__(self, name: str, model: Callable[[], Model] | Model, tools: dict[str, Tool],
                 version: str = "", tool_delay_s: Callable[[], float] | None = None) -> None:
        self.name = name
        self.version = version
        self._model = model
        self.tools = tools
        self._tool_delay_s = tool_delay_s

    def model(self) -> Model:
        if hasattr(self._model, "decide"):
            return self._model  # type: ignore[return-value]
        return self._model()  # type: ignore[operator]

    def run_step(self, runner: StepRunner) -> Outcome:
        decision = self._decide(runner)
        results = self._run_tools(runner, decision)
        record = {"step": runner.step, "name": decision.name, "text": decision.text,
                  "tool_calls": [c.__dict__ for c in decision.tool_calls], "results": results}
        if decision.final:
            return runner.finish(record, decision.answer or "")
        return runner.step_done(record, decision.name)

    def _decide(self, runner: StepRunner) -> Decision:
        if runner.decision is not None:
            decision = Decision.from_dict(runner.decision)
            unknown = sorted({c.name for c in decision.tool_calls} - set(self.tools))
            if unknown:
                raise TerminalError(f"checkpoint A of step {runner.step} asks for tool(s) {unknown} that agent "
                                    f"{self.name!r} no longer has (version {self.version or '-'}); the recorded "
                                    "decision cannot be replayed")
            runner.log.info("replaying", decision=decision.name, tool_calls=len(decision.tool_calls))
            return decision
        runner.log.info("running", phase=runner.run.phase)
        runner.emit(f"s{runner.step}:start", "step_started", {})
        runner.boundary()
        run = runner.run
        ctx = AgentContext(runner.run_id, run.query, run.kind, runner.step, runner.history, runner.replies(),
                           runner.c.epoch)
        model = self.model()
        decision: Decision = runner.with_retries("model", lambda: model.decide(ctx))
        faults.point("after_model_call", runner.run_id)
        runner.add_usage(decision.prompt_tokens, decision.completion_tokens)
        runner.emit(f"s{runner.step}:decision", "model_decision", {
            "name": decision.name, "text": decision.text,
            "tool_calls": [{"id": c.id, "name": c.name, "args": c.args} for c in decision.tool_calls],
        })
        # After the boundary: a holder frozen here and woken after a takeover meets the database fence
        # with its very next action (the chaos zombie's self-stop round relies on that).
        runner.boundary()
        runner.write_decided(decision.to_dict())
        return decision

    def _run_tools(self, runner: StepRunner, decision: Decision) -> dict[str, Any]:
        results: dict[str, Any] = {}
        for call in decision.tool_calls:
            runner.boundary()
            runner.emit(f"tool:{call.id}:start", "tool_started", {"id": call.id, "name": call.name, "args": call.args})
            tool = self.tools.get(call.name)
            if tool is None:
                raise TerminalError(f"the model asked for an unknown tool {call.name!r}")
            results[call.id] = runner.with_retries(f"tool {call.name}",
                                                   lambda c=call, t=tool: self._call(runner, t, c.id, c.args))
            runner.emit(f"tool:{call.id}:result", "tool_result", {"id": call.id, "name": call.name,
                                                                   "result": results[call.id]})
        return results

    def _call(self, runner: StepRunner, tool: Tool, call_id: str, args: dict[str, Any]) -> Any:
        if self._tool_delay_s is not None:
            delay = self._tool_delay_s()
            if delay:
                import time

                time.sleep(delay)  # the demo's tools answer at once; real ones take time
        with context.running(context.RunContext(runner.c, runner.step, call_id)):
            return tool.fn(args)
