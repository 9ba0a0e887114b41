"""Every Redis key fenced uses, in one place. Per-run keys share the {run_id} hash tag (Redis Cluster)."""

from __future__ import annotations

import zlib

PREFIX = "fenced"

# Global keys: no script touches two of them unless they share a hash tag.
# The reaper's index: ZSET "<holder>|<run_id>" -> lease deadline (ms), one member per holder, so a holder
# only ever removes or moves its own entry (a fenced-out holder cannot unwatch its successor). Sharded by
# run id into LEASE_INDEX_SHARDS keys with hash tags of their own, so on a Redis Cluster every lease
# take, renewal and release does not write one hot slot; every entry of a run is in its run's shard. The
# reaper reads every shard per tick (one pipeline). The same on one Redis: one code path everywhere.
LEASE_INDEX_SHARDS = 16


def lease_index_shard(shard: int) -> str:
    """The key of lease index shard `shard` (0 <= shard < LEASE_INDEX_SHARDS)."""
    return f"{PREFIX}:{{lidx:{shard}}}:lease-deadlines"


LEASE_INDEXES = tuple(lease_index_shard(k) for k in range(LEASE_INDEX_SHARDS))


def lease_index(run_id: str) -> str:
    """The lease index shard that holds `run_id`'s entries (CRC32 of the run id, mod the shard count)."""
    return LEASE_INDEXES[zlib.crc32(run_id.encode()) % LEASE_INDEX_SHARDS]

DEAD_LETTERS = f"{PREFIX}:dead-letters"  # STREAM of dead-lettered runs, capped
SWEEPER_LOCK = f"{PREFIX}:sweeper-lock"  # one sweeper per interval across workers
FAULTS = f"{PREFIX}:{{faults}}:armed"  # HASH point -> remaining hits (tests and chaos only)
FAULT_HITS = f"{PREFIX}:{{faults}}:hits"  # LIST of "point run_id pid" as points fire (tests and chaos only)
# Fast takeover: which processes hold leases, and which were presumed dead.
PROCESSES = f"{PREFIX}:processes"  # ZSET process token -> last seen ms (processes that took a lease)
LIVENESS_SUSPECTS = f"{PREFIX}:liveness-suspects"  # HASH token -> consecutive checks without a connection
PRESUMED_DEAD = f"{PREFIX}:presumed-dead"  # ZSET token -> when presumed dead (a live one = false positive)
LIVENESS_LOCK = f"{PREFIX}:liveness-lock"  # one connection check per tick across workers
RESCUES_UNDER_WAY = f"{PREFIX}:rescues-under-way"  # set (5 s TTL) by a batch of rescues: inline steps yield to them
FALSE_POSITIVES = f"{PREFIX}:fast-takeover:false-positives"  # counter: presumed dead, but alive
RENEW_FAILURES = f"{PREFIX}:renew-failures"  # HASH process token -> lease renewals its watchdog missed
PROMOTER_LOCK = f"{PREFIX}:promoter-lock"  # one large-run promotion per interval across workers

# Admission: every key shares the {admission} hash tag, so admit.lua touches one slot.
ADMISSION_TAG = "{admission}"
ADMITTED_UNSENT = f"{PREFIX}:{ADMISSION_TAG}:unsent"  # ZSET run_id -> admit ms; removed right after the send


def lease(run_id: str) -> str:
    return f"{PREFIX}:{{{run_id}}}:lease"


RESCUE_HOLDER = "rescue"  # the lease index's holder name for a rescue no delivery has answered yet


def index_member(run_id: str, holder: str) -> str:
    """The lease index's member for `holder`'s lease on `run_id` (a token or a handoff value; no "|")."""
    return f"{holder}|{run_id}"


def index_run_id(member: str) -> str:
    """The run id of a lease index member."""
    return member.split("|", 1)[-1]


def index_holder(member: str) -> str:
    """The holder part of a lease index member."""
    return member.split("|", 1)[0] if "|" in member else ""


def held_by(process: str) -> str:
    """SET of the run ids whose leases a process took: what a presumed-dead process held (fast takeover)."""
    return f"{PREFIX}:held:{process}"


def epoch(run_id: str) -> str:
    return f"{PREFIX}:{{{run_id}}}:epoch"


def events(run_id: str) -> str:
    return f"{PREFIX}:{{{run_id}}}:events"


def paid_calls(run_id: str) -> str:
    """HASH "epoch:step" -> model calls a provider billed; written by test models only (fencing.metering)."""
    return f"{PREFIX}:{{{run_id}}}:paid"


def rescue(run_id: str) -> str:
    return f"{PREFIX}:{{{run_id}}}:rescue"


def user_slots(user_id: str) -> str:
    """ZSET run_id -> admit ms of a user's admitted, unfinished runs (the per-user limit)."""
    return f"{PREFIX}:{ADMISSION_TAG}:user:{user_id}"


def broker_queue(queue: str) -> str:
    """The kombu list holding a queue's undelivered messages (kombu LPUSHes, workers BRPOP).

    Priority 0 only: fenced never sets message priorities, so kombu never writes `queue\\x06\\x16N`.
    admit.lua reads these lists (LLEN) beside the {admission} keys and promote.lua moves between two of
    them: fine on one Redis; the broker is never a Cluster."""
    return queue

