"""Run leases in Redis: acquire, release or hand over to the next step; the deadline index for the reaper."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import redis

from fencing import keys
from fencing.connection import get_redis, process_token
from fencing.scripts import scripts_for


def register(pipe: redis.client.Pipeline) -> None:
    """Record in `pipe` that this process holds leases (fast takeover watches these processes)."""
    from fenced.settings import get_settings

    if get_settings().fast_takeover:
        pipe.zadd(keys.PROCESSES, {process_token(): now_ms()})


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

    def acquire(self, step: int | None, client: redis.Redis | None = None) -> bool:
        """Take the lease if it is free, or if the previous step handed it over for `step`."""
        client = client or get_redis()
        handoff = handoff_value(step) if step is not None else ""
        pipe = client.pipeline(transaction=False)
        scripts_for(client)("acquire", [self.key], [self.token, self.ttl_ms, handoff], client=pipe)
        # GT: a refused acquire can only push a deadline later, never hide a lease from the reaper.
        pipe.zadd(keys.LEASE_INDEX, {self.run_id: now_ms() + self.ttl_ms}, gt=True)
        register(pipe)
        return bool(pipe.execute()[0])

    def release(self, handoff_step: int | None = None, client: redis.Redis | None = None) -> bool:
        """Drop the lease, or leave a handoff for step `handoff_step` that expires like a lease."""
        client = client or get_redis()
        pipe = client.pipeline(transaction=False)
        if handoff_step is None:
            pipe.zrem(keys.LEASE_INDEX, self.run_id)
            value = ""
        else:
            pipe.zadd(keys.LEASE_INDEX, {self.run_id: now_ms() + self.ttl_ms})
            value = handoff_value(handoff_step)
        scripts_for(client)("release", [self.key], [self.token, value, self.ttl_ms], client=pipe)
        return bool(pipe.execute()[-1])
