"""The per-process watchdog thread: renews every lease this process holds, batched in one pipeline."""

from __future__ import annotations

import os
import threading
import time

import redis
import structlog

from fencing import keys, scripts
from fencing.connection import get_redis, process_token
from fencing.lease import Lease, now_ms, register
from fencing.scripts import scripts_for

log = structlog.get_logger("fencing.watchdog")
PRESENCE_MS = 500


class Watchdog:
    """Renews tracked leases every heartbeat; a lease it cannot renew is marked lost."""

    def __init__(self, heartbeat_ms: int) -> None:
        self.heartbeat_ms = heartbeat_ms
        self._leases: dict[str, Lease] = {}
        self._lock = threading.Lock()
        # Held for a whole renewal, snapshot to replies; `untrack` takes it too. Without it a delivery
        # could let its lease go while a renewal that still counted it was in flight: the renewal found
        # the lease gone ("lease_lost", a renew failure counted) and its ZADD put back the index entry
        # the release had removed or set due now (a spurious or a delayed rescue). Seen 5 to 19 times
        # per 1,000-run window of the in-flight benchmark.
        self._renewing = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fenced-watchdog", daemon=True)
        self.renewals = 0
        # Renewals that failed (a lease found gone, or Redis unreachable), reported to the operator
        # overview (keys.RENEW_FAILURES) inside the next renewal's pipeline, only when the count changed.
        self.renew_failures = 0
        self._reported_failures = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def track(self, lease: Lease, step_timeout_s: float | None = None) -> None:
        """Renew `lease` from now on; past `step_timeout_s` it is let go (see `renew_all`)."""
        if step_timeout_s is not None:
            lease.renew_until = time.monotonic() + step_timeout_s
        with self._lock:
            self._leases[lease.token] = lease

    def untrack(self, lease: Lease) -> None:
        """Stop renewing `lease`; waits for a renewal in flight, so a release after this is never undone
        by one."""
        with self._renewing, self._lock:
            self._leases.pop(lease.token, None)

    def renew_all(self) -> None:
        """One round trip for every lease of the process: a renew script per lease and one ZADD per lease
        index shard its leases are in (on a Redis Cluster, one round trip per node, in parallel)."""
        with self._renewing:
            self._renew_all()

    def _renew_all(self) -> None:
        now = time.monotonic()
        with self._lock:
            overdue = [lease for lease in self._leases.values()
                       if not lease.lost and lease.renew_until is not None and now >= lease.renew_until]
            for lease in overdue:
                # A hung step (a tool or HTTP call with no timeout; the threads pool enforces no time
                # limit) must not hold its run forever: stop renewing, so the lease runs out and the run
                # is taken over from its last checkpoint. The stuck thread stops at its next boundary,
                # and any write it still makes is refused by the epoch.
                lease.lost = lease.timed_out = True
                self._leases.pop(lease.token, None)
            leases = [lease for lease in self._leases.values() if not lease.lost]
        for lease in overdue:
            log.warning("step_timeout_lease_let_go", run_id=lease.run_id, epoch=lease.epoch, token=lease.token)
            _record_timeout(lease)
        if not leases:
            return
        client = get_redis()
        registered = scripts_for(client)
        by_shard: dict[str, list[Lease]] = {}
        for lease in leases:
            by_shard.setdefault(lease.index, []).append(lease)

        def build(pipe: redis.client.Pipeline) -> None:
            for lease in leases:
                registered.queue(pipe, scripts.renew(lease.run_id, token=lease.token, ttl_ms=lease.ttl_ms))
            deadline = now_ms()
            for index, in_shard in by_shard.items():
                entries = {lease.member: deadline + lease.ttl_ms for lease in in_shard}
                pipe.zadd(index, entries, gt=True)
            pipe.zrem(keys.PRESUMED_DEAD, process_token())
            register(pipe, [lease.run_id for lease in leases])  # rebuilt after Redis lost it
            if self.renew_failures != self._reported_failures:
                pipe.hset(keys.RENEW_FAILURES, process_token(), self.renew_failures)

        results = registered.execute(client, build)
        self._reported_failures = self.renew_failures
        self.renewals += 1
        if results[len(leases) + len(by_shard)]:
            # Presumed dead by fast takeover while alive: a false positive. Counted; epochs kept it safe.
            client.incr(keys.FALSE_POSITIVES)
            log.warning("fast_takeover_false_positive", token=process_token())
        for lease, renewed in zip(leases, results[:len(leases)], strict=True):
            if not renewed:
                lease.lost = True
                self.renew_failures += 1
                log.warning("lease_lost", run_id=lease.run_id, token=lease.token)

    def _loop(self) -> None:
        # Wake at least every PRESENCE_MS: between renewals a PING keeps a named connection open (and
        # reopens it soon after a Redis restart), so fast takeover never mistakes us for dead. A renewal
        # is never put off to the next such wake-up: the lease's age at a takeover is one heartbeat.
        heartbeat_s, presence_s = self.heartbeat_ms / 1000, PRESENCE_MS / 1000
        next_renew = time.monotonic() + heartbeat_s
        while not self._stop.wait(max(0.0, min(presence_s, next_renew - time.monotonic()))):
            try:
                if time.monotonic() >= next_renew:
                    next_renew = time.monotonic() + heartbeat_s
                    self.renew_all()
                elif self._leases:
                    get_redis().ping()
            except Exception as exc:  # Redis down: keep trying; the lease TTL decides
                self.renew_failures += 1
                log.warning("lease_renew_failed", error=repr(exc))


def _record_timeout(lease: Lease) -> None:
    """Say in the ledger why the lease was let go, off the watchdog thread (a database wait must not
    delay the renewals of every other lease)."""

    def record() -> None:
        from checkpoints import ledger
        from fenced_core.settings import get_settings

        try:
            ledger.record(lease.run_id, lease.epoch, lease.token, "step_timeout",
                          f"step ran past step_timeout_s={get_settings().step_timeout_s}: the watchdog stopped "
                          "renewing its lease, so the run is taken over from its last checkpoint")
        except Exception as exc:  # the record is best effort; the lease runs out regardless
            log.warning("step_timeout_record_failed", run_id=lease.run_id, error=repr(exc))

    threading.Thread(target=record, name="fenced-timeout-record", daemon=True).start()


_watchdogs: dict[int, Watchdog] = {}
_wd_lock = threading.Lock()


def get_watchdog(heartbeat_ms: int) -> Watchdog:
    """The watchdog of this process, started on first use (after a fork, in the child)."""
    pid = os.getpid()
    with _wd_lock:
        wd = _watchdogs.get(pid)
        if wd is None:
            wd = _watchdogs[pid] = Watchdog(heartbeat_ms)
            wd.start()
        return wd
