"""The verdict on a finished run: done once, charged once, carded once, no tool shown twice.

One place for the checks the demo, the tests and the chaos suite judge runs by.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from checkpoints import billing, ledger, runs
from checkpoints.db import transaction
from checkpoints.schema import effects, run_holds
from examples.shopping.cards import cards_for
from fencing import events

CHECKS = {
    "done": "the run ends done with a complete answer",
    "charged_once": "exactly one settled hold, charged what the recorded usage costs",
    "cards": "one cart card where the agent added to cart, none elsewhere",
    "effects": "each effect (tasks.context.once, an agent's @effect) created once per request key, and kept",
    "paid_once": "one model call paid per step",
    "stream": "the live event view shows each recorded tool call once and one final answer",
}
# A run's terminal row commits first and its final event follows (tasks.endings): a verdict that reads
# the stream in between waits up to this long for the final event, then judges the stream it has.
FINAL_EVENT_GRACE_S = 5.0


@dataclass
class RunVerdict:
    """A finished run's outcome and, per check in CHECKS that broke, why."""

    run_id: str
    query: str = ""
    kind: str = ""
    state: str = "missing"
    steps: int = 0
    model_calls: int = 0
    credits_charged: int | None = None
    holds: list[str] = field(default_factory=list)
    cards: int = 0
    cards_expected: int = 0
    takeovers: int = 0
    took_over_from: list[str] = field(default_factory=list)  # lease tokens of the holders that died
    rescues: int = 0
    resumed_events: int = 0
    finished_by: str | None = None  # lease token of the holder that wrote the terminal state
    effects: int = 0  # effects created (ledger effect_created), one per request key when the run is sound
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def failures(self) -> list[str]:
        return [f"{k}: {v}" for k, v in self.failed.items()]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def holds_of(run_id: str) -> list[Any]:
    """The billing hold rows of a run (exactly one is expected)."""
    with transaction(readonly=True) as conn:
        return list(conn.execute(sa.select(run_holds).where(run_holds.c.run_id == run_id)).all())


def effect_keys(run_id: str) -> set[str]:
    """The request keys of the effects recorded for a run (one row per key: the key is the primary key)."""
    with transaction(readonly=True) as conn:
        return set(conn.execute(sa.select(effects.c.request_key).where(effects.c.run_id == run_id)).scalars())


def _effects_problem(run_id: str, entries: list[Any]) -> tuple[int, str | None]:
    # the key is in the entry's detail (older entries: the end of its reason, "<action> done once: <key>")
    created = [(e.detail or {}).get("key") or e.reason.rsplit(": ", 1)[-1]
               for e in entries if e.kind == "effect_created"]
    twice = sorted({k for k in created if created.count(k) > 1})
    if twice:
        return len(created), f"created more than once: {twice}"
    missing = sorted(set(created) - effect_keys(run_id))
    if missing:
        return len(created), f"created but not recorded in effects: {missing}"
    return len(created), None


def check_run(run_id: str, *, check_events: bool = True,
              final_event_grace_s: float = FINAL_EVENT_GRACE_S) -> RunVerdict:
    """Judge one run against the promise; `check_events=False` when Redis lost the stream on purpose.
    An ended run's stream is read again for up to `final_event_grace_s` until its final event is there."""
    run = runs.get_run(run_id)
    if run is None:
        return RunVerdict(run_id, failed={"done": "run row missing"})
    history = run.checkpoint.get("history", [])
    # An agent's steps record a model decision each (with its tool calls); a FencedTask's record a result.
    decisions = [h for h in history if "tool_calls" in h]
    holds = holds_of(run_id)
    settled = [h for h in holds if h.state == "settled"]
    entries = ledger.history(run_id)
    takeovers = [e for e in entries if e.kind == "takeover"]
    finished = next((e for e in entries if e.kind in ("done", "failed", "dead")), None)
    stream = read_stream(run_id, run.state, final_event_grace_s if check_events else 0.0)
    cart_calls = {c["id"] for h in decisions for c in h["tool_calls"] if c["name"] == "add_to_cart"}
    v = RunVerdict(
        run_id, run.query, run.kind, run.state, len(history), run.model_calls,
        settled[0].credits_charged if len(settled) == 1 else None, [h.state for h in holds],
        len(cards_for(run_id)), len(cart_calls), len(takeovers),
        [str(e.detail.get("previous_owner")) for e in takeovers], sum(e.kind == "rescue" for e in entries),
        sum(e.type == "task_resumed" for e in stream), finished.actor if finished else None,
    )
    if run.state != "done" or not run.answer:
        v.failed["done"] = f"state {run.state}, answer {'present' if run.answer else 'missing'}"
    expected = None
    if settled:
        expected = billing.credits_for(run.prompt_tokens, run.completion_tokens, settled[0].credits_held)
    n_settled = sum(e.kind == "settled" for e in entries)
    if len(holds) != 1 or len(settled) != 1 or v.credits_charged != expected or n_settled != 1:
        v.failed["charged_once"] = (f"holds {v.holds}, charged {v.credits_charged} (usage costs {expected}), "
                                    f"{n_settled} settlements")
    if v.cards != v.cards_expected or v.cards_expected > 1:
        v.failed["cards"] = f"{v.cards} cards for {v.cards_expected} add_to_cart calls"
    v.effects, problem = _effects_problem(run_id, entries)
    if problem:
        v.failed["effects"] = problem
    if run.model_calls != len(decisions):
        v.failed["paid_once"] = f"{run.model_calls} model calls paid for {len(decisions)} model decisions"
    if check_events:
        problem = _stream_problem(decisions, events.live_view(stream), run.state)
        if problem:
            v.failed["stream"] = problem
    return v


def read_stream(run_id: str, state: str, grace_s: float) -> list[events.Event]:
    """The run's stream; for a run that ended (`state` has a final event), read again for up to
    `grace_s` until it holds a final event, which the ending appends after its commit."""
    deadline = time.monotonic() + (grace_s if state in events.FINAL_EVENTS else 0.0)
    while True:
        stream = events.read(run_id)
        if any(e.type in events.FINAL_TYPES for e in stream) or time.monotonic() >= deadline:
            return stream
        time.sleep(0.05)


def _stream_problem(history: list[dict[str, Any]], view: list[events.Event], state: str) -> str | None:
    recorded = sorted(c["id"] for h in history for c in h["tool_calls"])
    shown = sorted(e.data.get("id", "") for e in view if e.type == "tool_started")
    finals = sum(e.type == "run_done" for e in view)
    if shown != recorded:
        return f"tools shown {shown} != recorded {recorded}"
    if finals != (1 if state == "done" else 0):
        return f"{finals} run_done events in the live view"
    return None
