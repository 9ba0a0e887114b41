"""The work every contender does per step, so only the machinery around it differs.

One step = one call of the demo agent's stub model (it sleeps FENCED_STUB_STEP_MS, which the benchmark
sets to 0 or to a realistic model latency) and its read-only tools (catalog search, compare). Fenced
runs get exactly this from `tasks.step.StepRunner`; plain Celery and DBOS call `agent_step` below.
The query has no buying word, so no run has a side effect (a cart card) the baselines would imitate.
"""

from __future__ import annotations

from typing import Any

from examples.shopping.stub import STEPS, StubModel
from examples.shopping.tools import TOOLS
from fenced_agents.model import AgentContext

BY_NAME = {t.name: t for t in TOOLS}
QUERY = "wireless headphones under $100"
STEPS_PER_RUN = len(STEPS)


def agent_step(run_id: str, step: int, history: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """Run step `step`; returns the history with it appended, and the answer once the run is final."""
    decision = StubModel().decide(AgentContext(run_id, QUERY, "normal", step, history))
    # The tools' plain functions (no run context here: the baselines have none).
    results = {c.id: BY_NAME[c.name](**c.args) for c in decision.tool_calls}
    entry = {"step": step, "name": decision.name, "text": decision.text,
             "tool_calls": [c.__dict__ for c in decision.tool_calls], "results": results}
    return [*history, entry], decision.answer if decision.final else None
