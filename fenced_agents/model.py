"""The model seam: a model is any object with `decide(ctx: AgentContext) -> Decision`, one call per step.

The agent loop calls `decide` once per step, before checkpoint A. What it must do:
- read only `ctx` (the request, the agent's instructions and tool schemas, every finished step with its
  tool results, a person's replies): it is all the run's state there is;
- return a Decision: tool calls to run (each with a fresh id), or `final=True` with the answer, and the
  call's token usage (what the user is billed for);
- raise TransientError for a failure worth retrying (timeout, 429, 5xx), TerminalError (or anything else)
  when retrying cannot help.
Under a crash or a takeover before checkpoint A, `decide` is called again for the same step by the new
holder (the lost call is the platform's cost); after checkpoint A it is never called again for that
step: the recorded decision is replayed. An optional `max_tokens` attribute is the most a call can
use; the loop holds it against the run's billing hold before each call (fenced_agents.bounds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    """One tool call a model asked for; `id` is unique in the run (a replay reuses the recorded one). It is
    checkpointed with its decision (checkpoint A), so after a crash or a takeover the same call, with the
    same id, is run; the live view shows it once."""

    id: str
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Decision:
    """What one model call decided: text, the tool calls to run, or the final answer.

    Recorded at checkpoint A with its usage: a resume after a crash or takeover replays it as it was (the
    same tool call ids, so effects and questions find their first records) and never bills it twice."""

    name: str  # the step's name (planner, item_search, ...): replay checks it matches
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    final: bool = False
    answer: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The decision as checkpoint A records it (every field; each tool call as id, name, args). Built by
        hand: `dataclasses.asdict` deep-copies every value and cost ~17 us a step here, this ~0.4 us."""
        return {"name": self.name, "text": self.text,
                "tool_calls": [{"id": c.id, "name": c.name, "args": c.args} for c in self.tool_calls],
                "final": self.final, "answer": self.answer, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        calls = [ToolCall(**c) for c in data.get("tool_calls", [])]
        return cls(**{**data, "tool_calls": calls})


@dataclass(frozen=True)
class AgentContext:
    """What the model sees: the user's request, the agent's instructions and tools, and every finished step
    (with tool results). Built from the run's checkpoint alone, so the next holder after a crash or a
    takeover builds the same context for the same step."""

    run_id: str
    query: str
    kind: str
    step: int
    history: list[dict[str, Any]]
    replies: list[dict[str, Any]] = field(default_factory=list)  # a person's answers: question, reply
    epoch: int = 0  # the holder's epoch: lets a test model count its paid calls per holder (fencing.metering)
    instructions: str = ""  # the agent's instructions (a system prompt); "" for programs that have none
    # The tools the model may call: {"name", "description", "parameters" (a JSON schema)} each.
    tools: list[dict[str, Any]] = field(default_factory=list)


class Model(Protocol):
    """A model provider (see the module docstring). Raise TransientError for retryable failures,
    TerminalError otherwise. Called again after a crash before checkpoint A, never after it: after a
    takeover past checkpoint A the new holder replays the recorded decision instead (no second paid call)."""

    def decide(self, ctx: AgentContext) -> Decision: ...
