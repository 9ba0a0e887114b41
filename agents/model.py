"""The model interface the runtime talks to: one call per step returns a Decision."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Decision:
    """What one model call decided: text, the tool calls to run, or the final answer."""

    name: str  # the step's name (planner, item_search, ...): replay checks it matches
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    final: bool = False
    answer: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        calls = [ToolCall(**c) for c in data.get("tool_calls", [])]
        return cls(**{**data, "tool_calls": calls})


@dataclass(frozen=True)
class AgentContext:
    """What the model sees: the user's request and every finished step (with tool results)."""

    run_id: str
    query: str
    kind: str
    step: int
    history: list[dict[str, Any]]
    replies: list[dict[str, Any]] = field(default_factory=list)  # a person's answers: question, reply
    epoch: int = 0  # the holder's epoch: lets a test model count its paid calls per holder (fencing.metering)


class Model(Protocol):
    """A model provider. Raise TransientError for retryable failures, TerminalError otherwise."""

    def decide(self, ctx: AgentContext) -> Decision: ...
