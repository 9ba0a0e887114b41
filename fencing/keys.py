"""Every Redis key fenced uses, in one place. Per-run keys share the {run_id} hash tag (Redis Cluster)."""

from __future__ import annotations

PREFIX = "fenced"

# Global keys: no script touches two of them unless they share a hash tag.
LEASE_INDEX = f"{PREFIX}:lease-deadlines"  # ZSET run_id -> lease deadline (ms); the reaper's index
DEAD_LETTERS = f"{PREFIX}:dead-letters"  # STREAM of dead-lettered runs, capped
SWEEPER_LOCK = f"{PREFIX}:sweeper-lock"  # one sweeper per interval across workers
FAULTS = f"{PREFIX}:{{faults}}:armed"  # HASH point -> remaining hits (tests and chaos only)
FAULT_HITS = f"{PREFIX}:{{faults}}:hits"  # LIST of "point run_id pid" as points fire (tests and chaos only)


def lease(run_id: str) -> str:
    return f"{PREFIX}:{{{run_id}}}:lease"


def epoch(run_id: str) -> str:
    return f"{PREFIX}:{{{run_id}}}:epoch"


def events(run_id: str) -> str:
    return f"{PREFIX}:{{{run_id}}}:events"


def rescue(run_id: str) -> str:
    return f"{PREFIX}:{{{run_id}}}:rescue"
