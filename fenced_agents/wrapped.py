"""What the wrappers of other frameworks' agents share (fenced_agents.pydantic_ai.FencedAgent,
fenced_agents.openai_agents.FencedOpenAIAgent): checking and registering the wrapper, submitting its runs,
one event loop per worker thread, and the fenced writes around a step's one model call and its tool calls.

Each wrapper lets its framework run one step (one model call and the tool calls it asks for); these pieces
make that step a fenced one, the same way for every framework:

    the model call   -> replayed from checkpoint A if recorded (refused if it names a dropped tool), else
                        step_started, the call, its usage, model_decision, checkpoint A
    each tool call   -> tool_started, the tool run in the run's context (an effect through `once`),
                        tool_result

Under a crash or a takeover: checkpoint A is written before any tool runs, so a new holder replays the
recorded response (no second paid call); a holder fenced out is refused at its next write (an event, an
effect, a checkpoint), and `boundary` stops one whose lease was lost before it starts anything new.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fenced_agents import bounds
from fenced_core.errors import TerminalError
from fencing import faults
from tasks import context, programs

if TYPE_CHECKING:
    from tasks.step import Outcome, StepRunner

_loops = threading.local()


def thread_loop() -> asyncio.AbstractEventLoop:
    """This worker thread's event loop, kept across steps (a provider's client caches its connections on it)."""
    loop = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = _loops.loop = asyncio.new_event_loop()
    return loop


class WrappedAgent:
    """The registered fenced program of a framework's agent: its name, version, effects and bounds."""

    def __init__(self, wrapper: str, framework_agent: str, name: str, *, effects: Iterable[str], version: str,
                 max_steps: int | None, known_tools: frozenset[str] | None, tools_are: str = "tools") -> None:
        """Checks only; the subclass registers the program (`register`) once its own checks passed.

        `wrapper` and `framework_agent` name the wrapper and the agent it wraps in the error for a missing
        name; `known_tools` are the agent's tools the effects must be among (None: not checkable);
        `tools_are` says what they are in the error ("tools", "function tools")."""
        self.name = name
        if not self.name:
            raise ValueError(f"{wrapper} needs a name: pass name=... or give the {framework_agent} one")
        self.version = version
        self.effects = frozenset(effects)
        self.max_steps = bounds.valid_max_steps(max_steps)
        bad = sorted(e for e in self.effects if not e or len(e) > 64)
        if bad:
            raise ValueError(f"effects: a tool name must be 1 to 64 characters, not {bad[0]!r}")
        if known_tools is not None and not self.effects <= known_tools:
            raise ValueError(f"effects: {sorted(self.effects - known_tools)} are not {tools_are} of agent "
                             f"{self.name!r} (its {tools_are}: {sorted(known_tools)})")

    def run_step(self, runner: StepRunner) -> Outcome:
        """One fenced step of the wrapped agent (the wrapper's own)."""
        raise NotImplementedError

    def register(self) -> None:
        """Register this wrapper as the program of its runs (by name) in this process."""
        programs.register(self)

    def submit(self, user_id: str, input: str, *, kind: str = "normal",
               idempotency_key: str | None = None) -> str:
        """Create a run of this agent and wake it; see `tasks.submit.submit_run` for what a crash does."""
        from tasks.submit import submit_run

        return submit_run(user_id, input, kind, idempotency_key, agent=self.name, agent_version=self.version)


class WrappedStep:
    """One fenced step of a wrapped agent: the tool calls made so far, and the fenced writes around them."""

    def __init__(self, agent: WrappedAgent, runner: StepRunner) -> None:
        self.agent = agent
        self.runner = runner
        self.calls: list[dict[str, Any]] = []

    def name(self) -> str:
        return ",".join(str(c["name"]) for c in self.calls) or "answer"

    def replaying(self, asked: set[str], tools: set[str]) -> None:
        """Checkpoint A's response asks for `asked`: refused (TerminalError) when the agent's `tools` lack one."""
        runner = self.runner
        if not asked <= tools:
            raise TerminalError(f"checkpoint A of step {runner.step} asks for tool(s) {sorted(asked - tools)} that "
                                f"agent {self.agent.name!r} no longer has (version {self.agent.version or '-'}); the "
                                "recorded response cannot be replayed")
        runner.log.info("replaying", tool_calls=len(asked))

    def calling(self) -> None:
        """Before the step's model call (its bounds are the wrapper's to check: fenced_agents.bounds)."""
        runner = self.runner
        runner.log.info("running", phase=runner.run.phase)
        runner.emit(f"s{runner.step}:start", "step_started", {})
        runner.boundary()

    def called(self, input_tokens: int, output_tokens: int, calls: list[dict[str, Any]], text: str,
               response: dict[str, Any]) -> None:
        """After the model answered: its usage, model_decision and checkpoint A (`response` as JSON)."""
        runner = self.runner
        faults.point("after_model_call", runner.run_id)
        runner.add_usage(input_tokens, output_tokens)
        runner.emit(f"s{runner.step}:decision", "model_decision",
                    {"name": ",".join(c["name"] for c in calls) or "answer", "text": text, "tool_calls": calls})
        runner.boundary()  # a holder frozen here meets the fence with its next write
        runner.write_decided({"response": response, "tool_calls": calls})

    def tool_started(self, call_id: str, name: str, args: Any) -> context.RunContext:
        """Before a tool call: tool_started, and the run context the tool runs in."""
        runner, step = self.runner, self.runner.step
        runner.boundary()
        entry = {"id": call_id, "name": name, "args": args}
        self.calls.append(entry)
        runner.emit(f"tool:s{step}:{call_id}:start", "tool_started", entry)
        faults.point("in_tool", runner.run_id)
        return context.RunContext(runner.c, step, f"s{step}:{call_id}")

    def tool_done(self, call_id: str, name: str, result: Any) -> None:
        """After a tool call: tool_result (`result` as JSON)."""
        self.runner.emit(f"tool:s{self.runner.step}:{call_id}:result", "tool_result",
                         {"id": call_id, "name": name, "result": result})
