"""Run leases in Redis: acquire, release or hand over to the next step; the deadline index for the reaper."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis

from fencing import keys
from fencing.connection import get_redis, process_token
from fencing.scripts import scripts_for


def register(pipe: redis.client.Pipeline, run_ids: Sequence[str] = (), process: str | None = None) -> None:
    """Record in `pipe` that `process` (default: this one) holds leases, and on which runs (fast
    takeover watches these processes)."""
    from fenced.settings import get_settings

    if get_settings().fast_takeover:
        token = process or process_token()
        pipe.zadd(keys.PROCESSES, {token: now_ms()})
        if run_ids:
            # What the process holds, so presuming it dead costs O(its leases), not O(runs in flight).
            # Entries may be stale (a lease lost or taken over); the lease value decides.
            pipe.sadd(keys.held_by(token), *run_ids)


def now_ms() -> int:
    return int(time.time() * 1000)


def handoff_value(step: int) -> str:
    """The lease value a finished step leaves for the delivery of the next one."""
    return f"handoff:{step}"


@dataclass
class Lease:
    """One delivery's hold on a run. The token names the process (for fast takeover) and the delivery."""

    run_id: str
    ttl_ms: int
    token: str = field(default_factory=lambda: f"{process_token()}/{uuid.uuid4().hex[:12]}")
    lost: bool = False

    @property
    def key(self) -> str:
        return keys.lease(self.run_id)

    @property
    def process(self) -> str:
        """The holder process's part of the token (the liveness registry's name for it)."""
        return self.token.split("/", 1)[0]

    def acquire(self, step: int | None, client: redis.Redis | None = None) -> bool:
        """Take the lease if it is free, or if the previous step handed it over for `step`."""
        client = client or get_redis()
        handoff = handoff_value(step) if step is not None else ""
        scripts = scripts_for(client)

        def build(pipe: redis.client.Pipeline) -> None:
            scripts.queue(pipe, "acquire", [self.key], [self.token, self.ttl_ms, handoff])
            # GT: a refused acquire can only push a deadline later, never hide a lease from the reaper.
            pipe.zadd(keys.LEASE_INDEX, {self.run_id: now_ms() + self.ttl_ms}, gt=True)
            register(pipe, [self.run_id], self.process)

        taken = bool(scripts.execute(client, build)[0])
        if not taken:
            # Not ours after all: keep the process's set to what it holds (a lease this process does
            # hold through another delivery is added back by the watchdog's next renewal).
            client.srem(keys.held_by(self.process), self.run_id)
        return taken

    def release(self, handoff_step: int | None = None, client: redis.Redis | None = None) -> bool:
        """Drop the lease, or leave a handoff for step `handoff_step` that expires like a lease."""
        client = client or get_redis()
        scripts = scripts_for(client)
        value = "" if handoff_step is None else handoff_value(handoff_step)

        def build(pipe: redis.client.Pipeline) -> None:
            if handoff_step is None:
                pipe.zrem(keys.LEASE_INDEX, self.run_id)
            else:
                pipe.zadd(keys.LEASE_INDEX, {self.run_id: now_ms() + self.ttl_ms})
            scripts.queue(pipe, "release", [self.key], [self.token, value, self.ttl_ms])
            pipe.srem(keys.held_by(self.process), self.run_id)

        return bool(scripts.execute(client, build)[-2])
