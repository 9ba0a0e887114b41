"""The routing score of one worker (pure): freshness, step speed, load and success, weighted by settings."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from fenced_core.settings import Settings
from fencing.registry import WorkerRecord


@dataclass(frozen=True)
class Candidate:
    """One worker's score and the factors behind it, as the ledger records them."""

    worker: str
    queue: str
    score: float
    freshness: float  # exp(-age / heartbeat period): ~1 on a fresh beat, ~0.05 at 3 periods
    speed: float  # 1 / (1 + average step seconds); 1 before the worker has finished a step
    load: float  # 1 / (1 + runs in flight), in flight = running + routed and not yet consumed (÷ concurrency
    # with FENCED_ROUTING_LOAD_PER_SLOT)
    success: float  # success rate over the last steps; 1 before the worker has finished a step
    age_ms: int
    avg_step_ms: float | None
    running: int
    queued: int
    concurrency: int
    status: str
    qualified: bool
    why_not: str = ""

    @property
    def in_flight(self) -> int:
        return self.running + self.queued

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("score", "freshness", "speed", "load", "success"):
            d[k] = round(d[k], 4)
        return d


def candidate(w: WorkerRecord, now_ms: int, s: Settings) -> Candidate:
    """Score `w` at `now_ms`. A worker qualifies when it is online, consumes its own queue and scores
    at least the threshold."""
    age = max(0, now_ms - w.beat_ms)
    freshness = math.exp(-age / s.routing_heartbeat_ms)
    avg = w.avg_step_ms
    speed = 1.0 / (1.0 + avg / 1000.0) if avg is not None else 1.0
    in_flight = w.running + w.queued
    load = 1.0 / (1.0 + (in_flight / max(1, w.concurrency) if s.routing_load_per_slot else in_flight))
    rate = w.success_rate
    success = rate if rate is not None else 1.0
    total = (s.routing_w_fresh * freshness + s.routing_w_speed * speed + s.routing_w_load * load
             + s.routing_w_success * success)
    why_not = ""
    if w.status != "online":
        why_not = w.status
    elif w.presumed_dead:  # fast takeover saw its process's connections gone: a rescue must not go back there
        why_not = "presumed dead (its process has no Redis connection)"
    elif not w.queue:
        why_not = "consumes no queue of its own (FENCED_ROUTING=shared there)"
    elif total < s.routing_threshold:
        why_not = f"score under {s.routing_threshold:g}"
    return Candidate(w.name, w.queue, total, freshness, speed, load, success, age, avg, w.running, w.queued,
                     w.concurrency, w.status, not why_not, why_not)


def ranked(cands: list[Candidate]) -> list[Candidate]:
    """Qualified first, then score descending, then runs in flight ascending, then name (stable)."""
    return sorted(cands, key=lambda c: (not c.qualified, -c.score, c.in_flight, c.worker))
