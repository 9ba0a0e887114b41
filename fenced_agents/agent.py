"""Agent: a model, instructions and plain functions as tools, run as one fenced program of the step runner."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

from fenced_agents.loop import AgentLoop
from fenced_agents.model import Model
from fenced_agents.tools import FunctionTool, as_tool, ask_user_tool
from tasks import programs


class Agent(AgentLoop):
    """An agent that workers can run: constructing it registers it under `name` in this process, so a
    worker that imports the defining module (FENCED_IMPORTS, or `celery -A`) runs its runs.

    One step is one `model.decide` call and the tools it asked for, each step its own Celery message;
    `model` is an object with `decide(ctx) -> Decision` (fenced_agents.model) or a no-argument factory of one.
    Under a crash or a takeover, a step resumes from its last checkpoint: before checkpoint A the model
    is asked again (that lost call is not billed), after it the recorded decision is replayed (read-only
    tools rerun, effects return their first result, `ask_user` its stored reply); a finished step never
    runs again. A replayed decision that names a tool this agent no longer has fails the run (terminal).
    A run stops, failed, at step `max_steps` (max_steps) or before a model call its billing hold could
    not cover (budget). `version` (default: a digest of the tools' names, kinds and schemas) is recorded
    on each run at submit."""

    def __init__(self, name: str, model: Model | Callable[[], Model], instructions: str = "", max_steps: int = 8,
                 tools: Iterable[Any] = (), version: str | None = None) -> None:
        super().__init__(name, model, {}, instructions=instructions, max_steps=max_steps)
        if version is not None and not 0 < len(version) <= 32:
            raise ValueError(f"an agent version must be 1 to 32 characters, not {version!r}")
        self._fixed_version = version
        self._builtin_ask = ask_user_tool()
        self._add(self._builtin_ask)
        for t in tools:
            self._add(as_tool(t))
        programs.register(self)

    @property
    def version(self) -> str:
        """The version runs record at submit: the one given, or a digest of the current tool set."""
        return self._fixed_version or tool_set_digest(self.tools.values())

    @version.setter
    def version(self, value: str | None) -> None:
        self._fixed_version = value

    def tool(self, fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
        """Decorator: a plain typed function becomes a read-only tool of this agent (rerun on replay)."""
        if fn is None:
            return lambda f: self._add(FunctionTool(f, "tool", name=name))
        return self._add(FunctionTool(fn, "tool", name=name))

    def effect(self, action: str, *, name: str | None = None) -> Callable[[Callable[..., Any]], FunctionTool]:
        """Decorator: the function becomes an effect of this agent, run once per (run, `action`, validated
        arguments) and fenced by the epoch; its first parameter receives the ToolContext."""
        return lambda fn: self._add(FunctionTool(fn, "effect", action=action, name=name))

    def submit(self, user_id: str, input: str, kind: str = "normal", idempotency_key: str | None = None) -> str:
        """Create a run of this agent (recording its version) and wake it; returns the run id.

        With `idempotency_key`, a retried submit returns the first run; see `tasks.submit.submit_run` for admission,
        billing and what a crash between the commit and the wake-up does (the sweeper sends it)."""
        from tasks.submit import submit_run

        return submit_run(user_id, input, kind, idempotency_key, agent=self.name, agent_version=self.version)

    def _add(self, t: FunctionTool) -> FunctionTool:
        old = self.tools.get(t.name)
        # The built-in ask_user may be replaced by the agent's own; any other name is taken once.
        if old is not None and old is not t and old is not self._builtin_ask:
            raise ValueError(f"agent {self.name!r} has a tool named {t.name!r} already")
        actions = {getattr(o, "action", None) for o in self.tools.values()} - {None}
        if t.action is not None and t.action in actions and self.tools.get(t.name) is not t:
            raise ValueError(f"agent {self.name!r} has an effect with action {t.action!r} already: two effects "
                             "sharing an action would share their once-only records")
        self.tools[t.name] = t
        return t


def tool_set_digest(tools: Iterable[Any]) -> str:
    """A short digest of tools' names, kinds, actions and argument schemas (12 hex characters)."""
    rows = sorted(
        (t.name, getattr(t, "kind", "tool"), getattr(t, "action", None),
         t.spec()["parameters"] if callable(getattr(t, "spec", None)) else None)
        for t in tools
    )
    body = json.dumps(rows, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:12]
