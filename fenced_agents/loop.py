"""The agent loop as a program of the step runner: one step = one model call and the tools it asked for.

model call -> checkpoint A (the decision and its usage) -> tools -> checkpoint B (their results), or the
terminal write when the decision is final. Resuming from checkpoint A replays the recorded decision (no
model call; read-only tools rerun, effects return their first result); from B, the next model call.
Before each model call (not before a replay) the run is bounded by fenced_agents.bounds.check, the check
FencedAgent makes too: step `max_steps` fails the run (MaxStepsExceeded), and so does a call whose most
expensive outcome the run's billing hold cannot cover (BudgetExceeded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fenced_agents import bounds
from fenced_agents.model import AgentContext, Decision, Model
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

    def call(self, args: dict[str, Any]) -> Any:
        return self.fn(args)


class LoopTool(Protocol):
    """What the loop runs for a tool call: `call(args)` inside the run's context (fenced_agents.tools.FunctionTool
    or Tool above); `spec()`, when it has one, is shown to the model."""

    name: str

    @property
    def read_only(self) -> bool: ...

    def call(self, args: dict[str, Any]) -> Any: ...


class AgentLoop:
    """The step program of an agent: `model` decides, `tools` act. Registered under `name` by its owner.

    `max_steps` bounds the model calls of a run (None: unbounded), and the run's billing hold bounds its
    model usage (fenced_agents.bounds): the call that would cross either is not made, and the run fails
    (class `max_steps` or `budget`), settled at most its hold. The check is made from the run's recorded
    step and usage, so a holder that takes over after a crash or a freeze applies the same bounds.
    `instructions` and the tools' specs are passed to the model in its AgentContext."""

    def __init__(self, name: str, model: Callable[[], Model] | Model, tools: dict[str, Any],
                 version: str = "", tool_delay_s: Callable[[], float] | None = None, *,
                 instructions: str = "", max_steps: int | None = 8) -> None:
        self.name = name
        self._version = version
        self._model = model
        self.tools: dict[str, LoopTool] = tools
        self._tool_delay_s = tool_delay_s
        self.instructions = instructions
        self.max_steps = bounds.valid_max_steps(max_steps)

    @property
    def version(self) -> str:
        """The version of the tool set this loop runs ("" = not checked)."""
        return self._version

    @version.setter
    def version(self, value: str) -> None:
        self._version = value

    def tool_specs(self) -> list[dict[str, Any]]:
        """The tools as the model is shown them (tools without a `spec()` are not described)."""
        return [t.spec() for t in self.tools.values() if callable(getattr(t, "spec", None))]  # type: ignore[attr-defined]

    def model(self) -> Model:
        """The model: the object given, or what the factory given returns (called once per step)."""
        if hasattr(self._model, "decide"):
            return self._model
        return self._model()

    def run_step(self, runner: StepRunner) -> Outcome:
        """One step of a claimed run: decide (or replay checkpoint A), run the tools, then checkpoint B or
        the terminal write. Every write is fenced by the runner's claim: a holder taken over stops at its
        next boundary or write, and the step runs again, from its last checkpoint, on the new holder."""
        decision = self._decide(runner)
        results = self._run_tools(runner, decision)
        record = {"step": runner.step, "name": decision.name, "text": decision.text,
                  "tool_calls": [c.__dict__ for c in decision.tool_calls], "results": results}
        if decision.final:
            return runner.finish(record, decision.answer or "")
        return runner.step_done(record, decision.name)

    def _decide(self, runner: StepRunner) -> Decision:
        if runner.decision is not None:
            return self._replayed(runner, Decision.from_dict(runner.decision))
        runner.log.info("running", phase=runner.run.phase)
        model = self.model()
        self._bound(runner, model)
        runner.emit(f"s{runner.step}:start", "step_started", {})
        runner.boundary()
        run = runner.run
        ctx = AgentContext(runner.run_id, run.query, run.kind, runner.step, runner.history, runner.replies(),
                           runner.c.epoch, self.instructions, self.tool_specs())
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

    def _replayed(self, runner: StepRunner, decision: Decision) -> Decision:
        """Checkpoint A's decision, to run again without a model call; refused (TerminalError) when it
        names a tool this agent no longer has: the run fails rather than guess."""
        unknown = sorted({c.name for c in decision.tool_calls} - set(self.tools))
        if unknown:
            raise TerminalError(f"checkpoint A of step {runner.step} asks for tool(s) {unknown} that agent "
                                f"{self.name!r} no longer has (version {self.version or '-'}); the recorded "
                                "decision cannot be replayed")
        if runner.run.agent_version and runner.run.agent_version != self.version:
            runner.log.info("replaying_on_another_version", submitted=runner.run.agent_version, running=self.version)
        runner.log.info("replaying", decision=decision.name, tool_calls=len(decision.tool_calls))
        return decision

    def _bound(self, runner: StepRunner, model: Model) -> None:
        """Refuse the model call a runaway run would make (fenced_agents.bounds.check): past max_steps, or
        over the billing hold, the estimate being the model's `max_tokens` (0 when it has none)."""
        bounds.check(runner, self.name, self.max_steps, getattr(model, "max_tokens", 0) or 0)

    def _run_tools(self, runner: StepRunner, decision: Decision) -> dict[str, Any]:
        results: dict[str, Any] = {}
        for call in decision.tool_calls:
            runner.boundary()
            runner.emit(f"tool:{call.id}:start", "tool_started", {"id": call.id, "name": call.name, "args": call.args})
            faults.point("in_tool", runner.run_id)
            tool = self.tools.get(call.name)
            if tool is None:
                raise TerminalError(f"the model asked for an unknown tool {call.name!r}")
            results[call.id] = runner.with_retries(f"tool {call.name}",
                                                   lambda c=call, t=tool: self._call(runner, t, c.id, c.args))
            runner.emit(f"tool:{call.id}:result", "tool_result", {"id": call.id, "name": call.name,
                                                                   "result": results[call.id]})
        return results

    def _call(self, runner: StepRunner, tool: LoopTool, call_id: str, args: dict[str, Any]) -> Any:
        if self._tool_delay_s is not None:
            delay = self._tool_delay_s()
            if delay:
                import time

                time.sleep(delay)  # the demo's tools answer at once; real ones take time
        with context.running(context.RunContext(runner.c, runner.step, call_id)):
            return tool.call(args)
