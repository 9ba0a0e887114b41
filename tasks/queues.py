"""Queue names, in the order workers consume them: continuations and rescues first, large runs last."""

from __future__ import annotations

CONTINUE = "agents.continue"  # next-step wake-ups and rescues: a run in flight finishes before new ones start
NORMAL = "agents"
LARGE = "agents.large"
ALL = (CONTINUE, NORMAL, LARGE)


def for_kind(kind: str) -> str:
    return LARGE if kind == "large" else NORMAL
