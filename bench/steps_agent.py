"""The benchmark's long-run agent `bench_steps`: N steps of one model call and one read-only tool call each.

The query says how many steps ("steps:50"); the model (a stub: the outside world) sleeps
FENCED_BENCH_MODEL_MS per call and uses a few tokens, so a 50-step run stays inside its billing hold.
Each step's tool returns about a kilobyte of catalog data (the demo's item_search), so the history a
run carries grows by a realistic record per step. Workers run it when FENCED_IMPORTS names this module;
`bench.longrun` and `bench.inflight` use it.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from typing import Any

from examples.shopping import catalog
from fenced import Agent
from fenced.models import AgentContext, Decision, ToolCall

NAME = "bench_steps"
MAX_STEPS = 200
QUERIES = ("headphones", "keyboard", "monitor", "speaker", "webcam", "charger")


def query(steps: int) -> str:
    """The query of a run that takes `steps` steps."""
    return f"steps:{steps}"


def steps_of(q: str) -> int:
    m = re.search(r"steps:(\d+)", q)
    return max(1, min(MAX_STEPS, int(m.group(1)))) if m else 4


class StepsModel:
    """One tool call per step until the last, then a final answer; sleeps FENCED_BENCH_MODEL_MS per call."""

    def __init__(self) -> None:
        self.model_ms = int(os.environ.get("FENCED_BENCH_MODEL_MS", "0"))

    def decide(self, ctx: AgentContext) -> Decision:
        if self.model_ms:
            time.sleep(self.model_ms / 1000)
        last = steps_of(ctx.query) - 1
        if ctx.step >= last:
            answer = f"done after {len(ctx.history)} tool steps"
            return Decision(f"s{ctx.step}", answer, [], final=True, answer=answer, prompt_tokens=10,
                            completion_tokens=5)
        call = ToolCall(f"call_{uuid.uuid4().hex[:20]}", "lookup", {"query": QUERIES[ctx.step % len(QUERIES)],
                                                                    "step": ctx.step})
        return Decision(f"s{ctx.step}", f"step {ctx.step}: looking up more", [call], prompt_tokens=10,
                        completion_tokens=5)


def lookup(query: str, step: int) -> list[dict[str, Any]]:
    """Catalog items for a query (read-only; rerun on replay).

    Args:
        query: what to look for.
        step: the step asking (echoed, so every record differs).
    """
    return [{**item, "step": step} for item in catalog.search(query, 5)]


agent = Agent(NAME, model=lambda: StepsModel(), instructions="Look things up, one step at a time.", max_steps=MAX_STEPS,
              tools=[lookup])
