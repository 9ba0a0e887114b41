"""The routing policy: `shared` (the shared queues, as before) or `reach` (the best-scoring live worker's queue).

`choose` reads the registry (O(workers)) and returns a Decision; tasks.wakeup sends and records it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from fenced_core.settings import get_settings
from fencing import registry
from routing import view
from routing.score import Candidate

QUEUE_PREFIX = registry.OWN_QUEUE_PREFIX  # a worker's own queue: agents.w.<node name>


def reach() -> bool:
    """True when wake-ups are routed (FENCED_ROUTING=reach)."""
    return get_settings().routing == "reach"


def queue_of(node: str) -> str:
    """The queue a worker with node name `node` (`w1@host`) consumes first under `reach`."""
    return QUEUE_PREFIX + node


def this_node() -> str:
    """This worker's node name (set at worker setup; pool children inherit it), or "" outside a worker."""
    return os.environ.get("FENCED_NODE_NAME", "")


@dataclass(frozen=True)
class Decision:
    """Where one wake-up goes: `worker`/`queue`, or nowhere (deferred) when `worker` is None."""

    worker: str | None
    queue: str | None
    candidates: list[Candidate] = field(default_factory=list)
    prefer: str | None = None
    kept_preferred: bool = False

    @property
    def deferred(self) -> bool:
        return self.worker is None

    def sentence(self) -> str:
        """Why, in one sentence (the ledger's reason)."""
        if self.worker is None:
            if not self.candidates:
                return "deferred: no worker is registered; routed again on the next scan"
            why = "; ".join(f"{c.worker} {c.why_not} ({c.score:.2f})" for c in self.candidates[:5])
            return f"deferred: no worker qualifies ({why}); routed again on the next scan"
        chosen = next(c for c in self.candidates if c.worker == self.worker)
        text = f"routed to {self.worker} (score {_describe(chosen)})"
        if self.kept_preferred:
            text += ": it ran the previous step and still qualifies"
        elif self.prefer:
            pref = next((c for c in self.candidates if c.worker == self.prefer), None)
            why = "not registered" if pref is None else (
                pref.why_not or f"overloaded or over {get_settings().routing_prefer_margin:g} under the best")
            text += f"; the previous step's worker {self.prefer} was passed over ({why})"
        others = [c for c in self.candidates if c.worker != self.worker]
        if others:
            nxt = others[0]
            text += f"; next: {nxt.worker} (score {_describe(nxt)}{', ' + nxt.why_not if nxt.why_not else ''})"
        return text

    def detail(self) -> dict[str, Any]:
        s = get_settings()
        return {"worker": self.worker, "queue": self.queue, "prefer": self.prefer,
                "kept_preferred": self.kept_preferred, "threshold": s.routing_threshold,
                "weights": {"freshness": s.routing_w_fresh, "speed": s.routing_w_speed, "load": s.routing_w_load,
                            "success": s.routing_w_success},
                "candidates": [c.as_dict() for c in self.candidates]}


def _describe(c: Candidate) -> str:
    avg = f"{c.avg_step_ms / 1000:.2f} s" if c.avg_step_ms is not None else "none yet"
    return (f"{c.score:.2f}: freshness {c.freshness:.2f}, average step {avg}, {c.running} running + "
            f"{c.queued} queued, success {c.success:.0%}")


def candidates(now_ms: int | None = None) -> list[Candidate]:
    """Every registered worker scored now, best first (qualified ones before the rest): routing.view's
    computation, the one `fenced workers` and the dashboard show."""
    return [w.routing for w in view.scored(now_ms)]


def choose(prefer: str | None = None) -> Decision:
    """Pick a worker: `prefer` (the worker that ran the previous step) when it qualifies, has a free slot
    once its current step ends, and scores within `routing_prefer_margin` of the best (counting that
    step as ended); else the best qualified one; None when nobody qualifies. Read-only: a crash here
    sends and records nothing, and the caller's commit stays for the sweeper to wake."""
    s = get_settings()
    cands = candidates()
    qualified = [c for c in cands if c.qualified]
    if prefer and qualified:
        pref = next((c for c in qualified if c.worker == prefer), None)
        # Its running count still holds the step that is sending this continuation.
        if pref is not None and pref.running - 1 + pref.queued < pref.concurrency:
            ended = pref.running - 1 + pref.queued  # its load with the sending step ended
            slots = pref.concurrency if s.routing_load_per_slot else 1
            own = pref.score + s.routing_w_load * (1.0 / (1.0 + ended / slots) - pref.load)
            if own >= qualified[0].score - s.routing_prefer_margin:
                return Decision(pref.worker, pref.queue, cands, prefer, kept_preferred=True)
    if not qualified:
        return Decision(None, None, cands, prefer)
    best = qualified[0]
    return Decision(best.worker, best.queue, cands, prefer)
