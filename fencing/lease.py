"""Run leases in Redis: acquire, release or hand over to the next step; the deadline index for the reaper."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis

from fencing import keys, scripts
from fencing.connection import get_redis, process_token
from fencing.scripts import scripts_for

if TYPE_CHECKING:
    from fencing.events import Appends


def register(pipe: redis.client.Pipeline, run_ids: Sequence[str] = (), process: str | None = None) -> None:
    """Record in `pipe` that `process` (default: this one) holds leases, and on which runs (fast
    takeover watches these processes)."""
    from fenced_core.settings import get_settings

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
    epoch: int = -1  # the claim's epoch once claimed (for the ledger)
    # time.monotonic() past which the watchdog stops renewing: the step overran step_timeout_s
    renew_until: float | None = None
    timed_out: bool = False
    # acquire() took the handoff the previous step left for this step (not a free lease): the row was
    # at this step, handed over and committed, when the handoff was set (see tasks.delivery)
    took_handoff: bool = False
    # let go already, in the round trip of the run's final event (tasks.endings.finished)
    released: bool = False

    @property
    def key(self) -> str:
        return keys.lease(self.run_id)

    @property
    def process(self) -> str:
        """The holder process's part of the token (the liveness registry's name for it)."""
        return self.token.split("/", 1)[0]

    @property
    def index(self) -> str:
        """The reaper's index shard this run's entries live in."""
        return keys.lease_index(self.run_id)

    @property
    def member(self) -> str:
        """This holder's entry in the reaper's index."""
        return keys.index_member(self.run_id, self.token)

    def acquire(self, step: int | None, client: redis.Redis | None = None) -> bool:
        """Take the lease if it is free, or if the previous step handed it over for `step`
        (`took_handoff` then says so)."""
        client = client or get_redis()
        handoff = handoff_value(step) if step is not None else ""
        registered = scripts_for(client)

        def build(pipe: redis.client.Pipeline) -> None:
            registered.queue(pipe, scripts.acquire(self.run_id, token=self.token, ttl_ms=self.ttl_ms, handoff=handoff))
            # Our own index entry: a refused acquire cannot move anyone else's deadline.
            pipe.zadd(self.index, {self.member: now_ms() + self.ttl_ms})
            # A rescue's or a handoff's entry is done with once a delivery holds the run (a refused
            # acquire means another delivery does, and it removes them too).
            pipe.zrem(self.index, keys.index_member(self.run_id, keys.RESCUE_HOLDER),
                      *([keys.index_member(self.run_id, handoff)] if handoff else []))
            register(pipe, [self.run_id], self.process)

        reply = int(registered.execute(client, build)[0])
        taken = reply in (1, 2)
        self.took_handoff = reply == 2
        if not taken:
            # Not ours after all: no index entry, and the process's set keeps to what it holds. A
            # duplicate wake-up delivered to the process that holds the run through another delivery
            # (reply 3) must not take the run out of the set: fast takeover would then miss it if the
            # process died before its watchdog's next renewal put it back, and the run would wait a lease.
            pipe = client.pipeline(transaction=False)
            pipe.zrem(self.index, self.member)
            if reply != 3:
                pipe.srem(keys.held_by(self.process), self.run_id)
            pipe.execute()
        return taken

    def renew(self, client: redis.Redis | None = None, *, llen: str | None = None,
              exists: str | None = None, appends: Appends | None = None) -> tuple[bool, int]:
        """Extend the lease for a full ttl if it is still ours (and move our index entry with it): one
        round trip, which also reads the length of list `llen` when given (a key on the same Redis: a
        broker queue), or whether key `exists` exists (1/0), else 0. Not renewed: lost (expired, taken
        over, or Redis lost it); `lost` is set. `appends` (event appends) go first in the same round
        trip and are settled before anything else is read: a refused one raises FencedOut."""
        assert llen is None or exists is None, "one read rides with a renewal"
        client = client or get_redis()
        registered = scripts_for(client)
        riding = appends.calls() if appends is not None else []

        def build(pipe: redis.client.Pipeline) -> None:
            for call in riding:
                registered.queue(pipe, call)
            registered.queue(pipe, scripts.renew(self.run_id, token=self.token, ttl_ms=self.ttl_ms))
            pipe.zadd(self.index, {self.member: now_ms() + self.ttl_ms}, gt=True)
            if llen is not None:
                pipe.llen(llen)
            elif exists is not None:
                pipe.exists(exists)

        try:
            replies = registered.execute(client, build)
        except Exception:
            if appends is not None:  # sent, maybe run: whoever appends them next looks first (Appends.send)
                appends.unsettled = True
            raise
        if appends is not None:
            appends.settle(replies[:len(riding)])
            replies = replies[len(riding):]
        renewed = int(replies[0]) == 1
        if not renewed:
            self.lost = True
        return renewed, int(replies[2]) if llen is not None or exists is not None else 0

    def release(self, handoff_step: int | None = None, client: redis.Redis | None = None,
                watch_until_ms: int | None = None) -> bool:
        """Drop the lease, or leave a handoff for step `handoff_step` that expires like a lease.

        With `watch_until_ms`, this holder's index entry stays (moved to that deadline) so the reaper
        rescues the run then unless `unwatch()` comes first: for a holder that lets go before its
        last write (parking) or that stopped early and wants the run rescued soon. Returns True if
        the lease was still ours."""
        client = client or get_redis()
        return bool(scripts_for(client).execute_all(client, self.release_calls(handoff_step, watch_until_ms))[0])

    def release_calls(self, handoff_step: int | None = None,
                      watch_until_ms: int | None = None) -> list[scripts.Call | scripts.Command]:
        """What `release` sends, in one round trip of its own or riding in another (a run's final event:
        tasks.endings); the first reply says whether the lease was still ours."""
        value = "" if handoff_step is None else handoff_value(handoff_step)
        calls: list[scripts.Call | scripts.Command] = [
            scripts.release(self.run_id, token=self.token, handoff=value, handoff_ttl_ms=self.ttl_ms)]
        if value:
            calls.append(scripts.Command("ZADD", (self.index,), (now_ms() + self.ttl_ms,
                                                                 keys.index_member(self.run_id, value))))
        if watch_until_ms is None:
            calls.append(scripts.Command("ZREM", (self.index,), (self.member,)))
        else:
            calls.append(scripts.Command("ZADD", (self.index,), (watch_until_ms, self.member)))
        calls.append(scripts.Command("SREM", (keys.held_by(self.process),), (self.run_id,)))
        return calls

    def unwatch(self, client: redis.Redis | None = None) -> None:
        """Remove this holder's index entry (its last write committed after an early release)."""
        (client or get_redis()).zrem(self.index, self.member)


def drop(run_id: str, client: redis.Redis | None = None) -> None:
    """Delete the run's lease whoever holds it: only for a run that just ended by a claim of its own
    (cancel). Its holder's watchdog finds it gone and stops at its next boundary; the epoch fences it."""
    (client or get_redis()).delete(keys.lease(run_id))


def rescue_answered(run_id: str, client: redis.Redis | None = None) -> None:
    """A wake-up found the run with nothing to do (ended, waiting on a person): any rescue out for it is
    answered, so its index entry goes (else the reaper would rescue a finished run again and again)."""
    (client or get_redis()).zrem(keys.lease_index(run_id), keys.index_member(run_id, keys.RESCUE_HOLDER))
