"""The registry as operators see it: every worker with its routing score now and the factors behind it.

One computation for every reader: `fenced workers [--json]` and the dashboard's worker panel (the
overview hub pushes what changed) both call `scored` / `snapshot`, so they can never disagree on a
score. Read-only: one registry read (O(workers)), nothing written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fenced_core.settings import get_settings
from fencing import registry
from fencing.registry import WorkerRecord
from routing.score import Candidate, candidate, ranked


@dataclass(frozen=True)
class ScoredWorker:
    """A worker as the registry has it (`record`) and as the policy scores it now (`routing`)."""

    record: WorkerRecord
    routing: Candidate

    def as_dict(self) -> dict[str, Any]:
        return {**self.record.as_dict(), "routing": self.routing.as_dict()}


def scored(now_ms: int | None = None) -> list[ScoredWorker]:
    """Every registered worker (online, draining, offline) scored at `now_ms` (now), best first:
    qualified ones before the rest, as the policy ranks them."""
    s = get_settings()
    now = registry.now_ms() if now_ms is None else now_ms
    records = {w.name: w for w in registry.all_workers()}
    cands = ranked([candidate(w, now, s) for w in records.values()])
    return [ScoredWorker(records[c.worker], c) for c in cands]


def snapshot(now_ms: int | None = None) -> dict[str, Any]:
    """The policy, its threshold and weights, and every worker with its score and factors (JSON-ready)."""
    s = get_settings()
    now = registry.now_ms() if now_ms is None else now_ms
    return {"policy": s.routing, "threshold": s.routing_threshold, "at_ms": now,
            "weights": {"freshness": s.routing_w_fresh, "speed": s.routing_w_speed, "load": s.routing_w_load,
                        "success": s.routing_w_success},
            "load_per_slot": s.routing_load_per_slot, "queue_warn": s.routing_queue_warn,
            "workers": [w.as_dict() for w in scored(now)]}
