"""The verdict on a finished run: done once, charged once, carded once, no tool shown twice."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from checkpoints import effects, ledger, runs
from checkpoints.db import transaction
from checkpoints.schema import run_holds
from fencing import events
from tasks.agent.stub import wants_cart


@dataclass
class RunVerdict:
    run_id: str
    state: str
    credits_charged: int | None
    settled_holds: int
    cards: int
    takeovers: int
    resumed_events: int
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def holds_of(run_id: str) -> list[dict[str, Any]]:
    with transaction() as conn:
        rows = conn.execute(sa.select(run_holds).where(run_holds.c.run_id == run_id)).mappings().all()
    return [dict(r) for r in rows]


def check_run(run_id: str, *, check_events: bool = True) -> RunVerdict:
    """Judge one run against the promise; `check_events=False` when Redis lost the stream on purpose."""
    run = runs.get_run(run_id)
    if run is None:
        return RunVerdict(run_id, "missing", None, 0, 0, 0, 0, ["run row missing"])
    holds = holds_of(run_id)
    settled = [h for h in holds if h["state"] == "settled"]
    cards = effects.cards_for(run_id)
    history = ledger.history(run_id)
    evs = events.read(run_id)
    verdict = RunVerdict(
        run_id, run.state, settled[0]["credits_charged"] if settled else None, len(settled), len(cards),
        sum(1 for e in history if e.kind == "takeover"), sum(1 for e in evs if e.type == "task_resumed"),
    )
    f = verdict.failures
    # 1. done with a complete answer
    if run.state != "done" or not run.answer:
        f.append(f"1: state {run.state}, answer {'present' if run.answer else 'missing'}")
    # 2. exactly one settled hold, charged something
    if len(holds) != 1 or len(settled) != 1 or not settled[0]["credits_charged"]:
        f.append(f"2: holds {[(h['state'], h['credits_charged']) for h in holds]}")
    # 3. one cart card where the agent added to cart, none elsewhere
    want = 1 if wants_cart(run.query) else 0
    if len(cards) != want:
        f.append(f"3: {len(cards)} cart cards, expected {want}")
    # 4. the live view shows each recorded tool call exactly once, and nothing else
    if check_events:
        f.extend(_event_failures(run, evs))
    return verdict


def _event_failures(run: runs.Run, evs: list[events.Event]) -> list[str]:
    view = events.live_view(evs)
    recorded = {c["id"] for h in run.checkpoint.get("history", []) for c in h["tool_calls"]}
    started = Counter(e.data["id"] for e in view if e.type == "tool_started")
    out = []
    twice = [i for i, n in started.items() if n > 1]
    if twice:
        out.append(f"4: tool calls shown twice: {twice}")
    if set(started) != recorded:
        out.append(f"4: tools shown {sorted(started)} != recorded {sorted(recorded)}")
    finals = [e for e in view if e.type == "run_done"]
    if run.state == "done" and len(finals) != 1:
        out.append(f"4: {len(finals)} run_done events in the live view")
    return out
