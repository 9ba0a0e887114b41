"""The registry scan (one worker per interval): offline marks, rerouting, deferred runs, queue watch.

Cost per scan: O(workers) reads plus O(wake-ups to move); never O(runs in flight)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import structlog

from fenced_core.settings import get_settings
from fencing import registry
from fencing.connection import process_token
from routing import policy, queue_watch

log = structlog.get_logger("routing.scan")
# send(run_id, step, reason, kind): a wake-up through tasks.wakeup.send (routed again under `reach`)
Resend = Callable[[str, int | None, str, str], None]
DEFERRED_BATCH = 100
MISSES_TO_OFFLINE = 2  # scans in a row without a Redis connection of the worker's process


offline_after_ms = registry.offline_after_ms


@dataclass
class ScanResult:
    """What one scan did (for logs and tests)."""

    scanned: bool = False
    offline: list[str] = field(default_factory=list)
    rerouted: list[str] = field(default_factory=list)
    routed_deferred: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def scan(resend: Resend, shared_queues: Iterable[str] = (), force: bool = False) -> ScanResult:
    """One scan unless another process scanned within `routing_scan_ms` (or `force`). A scanner that
    dies mid-scan holds the lock one interval at most; the next scan redoes what is left (marks are
    idempotent, a wake-up sent twice is a duplicate the lease drops)."""
    s = get_settings()
    out = ScanResult()
    if not force and not registry.try_scan_lock(process_token(), s.routing_scan_ms):
        return out
    out.scanned = True
    now = registry.now_ms()
    for name in registry.stale(now - offline_after_ms()):
        _offline(name, f"no heartbeat for over {offline_after_ms() / 1000:g} s", resend, out)
    _connections_gone(resend, out)
    if policy.reach() and registry.deferred_count():
        _route_deferred(resend, out)
    _watch_queues(shared_queues, out)
    return out


def _offline(name: str, reason: str, resend: Resend, out: ScanResult) -> None:
    pending = registry.mark_offline(name, reason)
    if pending is None:  # offline already: reroute what a racing router sent it since; forget it when old
        pending = registry.take_pending(name)
        beat = registry.last_beat_ms(name)
        if beat is not None and registry.now_ms() - beat > registry.OFFLINE_KEEP_MS:
            registry.forget(name)
    else:
        out.offline.append(name)
        log.warning("worker_offline", worker=name, reason=reason, rerouted=len(pending))
        registry.warn({"kind": "worker_offline", "worker": name, "reason": reason, "rerouted": len(pending)})
    for member in pending:
        run_id, _, step = member.partition("|")
        try:
            resend(run_id, int(step) if step else None, "reroute", "normal")
            out.rerouted.append(run_id)
        except Exception as exc:  # the reaper or the sweeper rescues it as before
            log.warning("reroute_failed", run_id=run_id, worker=name, error=repr(exc))


def _connections_gone(resend: Resend, out: ScanResult) -> None:
    """A killed worker's Redis connections vanish at once: offline after MISSES_TO_OFFLINE scans, long
    before its heartbeat goes stale (a frozen one keeps them and waits for the heartbeat bound)."""
    online = [w for w in registry.all_workers() if w.status == "online" and w.fields.get("token")]
    if not online:
        return
    misses = registry.connection_misses({w.name: w.fields["token"] for w in online})
    for w in online:
        seen = misses[w.name]
        if not seen:
            continue
        if seen >= MISSES_TO_OFFLINE:
            registry.clear_suspect(w.name)
            _offline(w.name, f"its process has no Redis connection on {MISSES_TO_OFFLINE} scans", resend, out)
        elif w.presumed_dead:  # fast takeover checked it already (every liveness tick): no second look
            registry.clear_suspect(w.name)
            _offline(w.name, "presumed dead by fast takeover: its process has no Redis connection", resend, out)


def _route_deferred(resend: Resend, out: ScanResult) -> None:
    if not any(c.qualified for c in policy.candidates()):
        return  # still nobody: they stay deferred (no ledger entry per scan)
    batch = registry.deferred(DEFERRED_BATCH)
    registry.undefer(r for r, _ in batch)
    for run_id, info in batch:
        try:
            resend(run_id, info.get("step"), str(info.get("reason", "rescue")), str(info.get("kind", "normal")))
            out.routed_deferred.append(run_id)
        except Exception as exc:  # the sweeper wakes it (no lease, no progress)
            log.warning("deferred_send_failed", run_id=run_id, error=repr(exc))


def _watch_queues(shared_queues: Iterable[str], out: ScanResult) -> None:
    _states, raised, _cleared = queue_watch.watch(shared_queues)
    out.warnings.extend(raised)
