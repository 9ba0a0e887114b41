"""The queue watch: length and lag of every queue wake-ups wait in; a warning when one grows past the threshold.

Watched: the shared queues and the own queue of every worker not offline. Lag = how long the oldest
message has waited (every wake-up carries a `fenced_sent_ms` header). A queue longer than
`routing_queue_warn` messages raises one `queue_long` warning on the routing feed (and in the log);
once it is back to `CLEAR_RATIO` of the threshold or less, one `queue_ok`. The mark lives in Redis
(`registry.QUEUE_LONG`), so however many processes watch (every worker's scan, each API's dashboard
hub and /metrics scrape), a crossing is said once. Cost: O(queues) per watch, never O(messages)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import structlog

from fenced_core.settings import get_settings
from fencing import registry

log = structlog.get_logger("routing.queue_watch")
CLEAR_RATIO = 0.75  # a long queue is cleared at 3/4 of the threshold: one that hovers at it does not flap


@dataclass(frozen=True)
class QueueState:
    """One queue now: messages waiting, ms the oldest has waited (None: empty or unstamped), and
    whether it is marked over the threshold (after this watch)."""

    queue: str
    length: int
    lag_ms: int | None
    long: bool


def watched(shared: Iterable[str]) -> list[str]:
    """The shared queues, then the own queues of each worker that is not offline (O(workers))."""
    own = [q for w in registry.all_workers() if w.queue and w.status != "offline"
           for q in (registry.urgent_queue(w.queue), w.queue)]
    names = list(shared)
    return names + [q for q in own if q not in names]


def watch(shared: Iterable[str]) -> tuple[list[QueueState], list[str], list[str]]:
    """Read every watched queue; raise or clear its warning on a crossing. Returns (states, queues
    this call warned about, queues this call cleared)."""
    threshold = get_settings().routing_queue_warn
    marked = registry.queues_long()
    states, raised, cleared = [], [], []
    for queue, (length, lag_ms) in registry.queue_depths(watched(shared)).items():
        long = queue in marked
        event = {"kind": "queue_long", "queue": queue, "length": length,
                 "lag_ms": "" if lag_ms is None else lag_ms, "threshold": threshold, "at_ms": registry.now_ms()}
        if length > threshold and not long:
            long = True
            if registry.queue_long_raise(queue, event):
                raised.append(queue)
                log.warning("queue_long", queue=queue, length=length, lag_ms=lag_ms, threshold=threshold)
        elif long and length <= threshold * CLEAR_RATIO:
            long = False
            if registry.queue_long_clear(queue, {**event, "kind": "queue_ok"}):
                cleared.append(queue)
                log.info("queue_ok", queue=queue, length=length, lag_ms=lag_ms, threshold=threshold)
        states.append(QueueState(queue, length, lag_ms, long))
    # A mark left by a queue no longer watched (its worker went offline): nobody waits there for it.
    for queue in set(marked) - {s.queue for s in states}:
        if registry.queue_long_clear(queue, {"kind": "queue_ok", "queue": queue, "length": "",
                                             "lag_ms": "", "threshold": threshold, "at_ms": registry.now_ms(),
                                             "why": "no longer watched"}):
            cleared.append(queue)
    return states, raised, cleared
