"""Chaos scenario `redis-failover`: SIGKILL the Sentinel-managed Redis primary with runs in flight.

The workers' broker and fenced's Redis both go through Sentinel. The primary dies; the sentinels promote
the replica. Replication is asynchronous, so the promoted replica may lack the last writes before the
kill: lease renewals and claims (a lease lost), epoch-mirror raises, events, broker messages (a wake-up
lost). Every run must still finish exactly once: the epoch in the database fences whoever held the
run before, and the sweeper re-sends a wake-up for a run with no lease and no progress.

Proof it acted: the primary's process is gone (checked by pid) with runs in flight, and the sentinels
name another master. Reported per round: failover (kill -> a sentinel names a new master that answers
as one), takeover (kill -> the next claim of each run held at the kill, from the ledger: durable, unlike
the event stream) and recovery (kill -> every run of the round terminal).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial

from chaos.harness import QUERIES, ChaosConfig, Cluster, control_charge, judge, rows, wait_for, wait_terminal
from chaos.nodes import WorkerNode
from chaos.report import ScenarioResult
from chaos.scenarios import SCENARIOS, SWEEPER_RESCUE, Progress, _cluster, _in_flight
from chaos.sentinel import Failover, SentinelNode, pid_alive, through_sentinel
from checkpoints import ledger
from checkpoints.schema import TERMINAL_STATES
from fenced_core.settings import get_settings
from harness.verdict import check_run

CLAIMS = ("claimed", "takeover")
# How Celery 5.7 / kombu 5.7 sometimes end a worker when the broker's master dies (docs/redis-sentinel.md).
KOMBU_CLOSE_CRASH = "Unrecoverable error"
RECONNECTED = "Connected to sentinel://"


def redis_failover(cfg: ChaosConfig, times: int = 3, runs: int = 12, progress: Progress = print) -> ScenarioResult:
    """`times` failovers, each with `runs` runs submitted just before; see the module doc."""
    result = ScenarioResult("redis-failover", {"times": times, "runs": runs, "lease_ms": cfg.lease_ms})
    if not through_sentinel():
        result.notes.append("skipped: fenced's Redis and the broker are not behind Sentinel (run `fenced chaos "
                            "--sentinel`)")
        return result
    node = SentinelNode()
    # Steps long enough that a kill lands mid-step; enough slots that every run is in flight at once.
    slow = replace(cfg, step_ms=max(cfg.step_ms, 600), concurrency=max(cfg.concurrency, runs // 2 + 1))
    grace_s = get_settings().sweeper_grace_ms / 1000
    with _cluster(slow) as (cluster, submit), _supervised(cluster) as restarts:
        cluster.start(2)
        control = control_charge(submit, slow.timeout_s)
        for i in range(times):
            marks = {str(n.name): n.log_mark() for n in cluster.nodes}
            ids = [submit(f"failover-{i}-{n}", QUERIES[n % len(QUERIES)]) for n in range(runs)]
            wait_for(partial(_running, ids, max(1, runs // 2)), 60)
            before = {r.run_id: r for r in rows(ids)}
            failover = node.kill_master()
            in_flight = [r for r, row in before.items() if row.state not in TERMINAL_STATES]
            held = {r: row.owner for r, row in before.items() if row.state == "running" and row.owner}
            node.wait_promoted(failover)
            _judge_round(result, failover, ids, in_flight, held, control, slow.timeout_s + grace_s)
            result.notes.append(_broker_note(cluster.nodes, marks, restarts))
            progress(f"redis-failover {i + 1}/{times}: primary :{failover.old[1]} killed with {len(in_flight)} runs "
                     f"in flight ({len(held)} held), master now {failover.new and failover.new[1]}")
            restored = node.restore()
            if restored:
                result.notes.append(f"round {i + 1}: the killed server is back as a replica ({restored})")
    return result


def _judge_round(result: ScenarioResult, failover: Failover, ids: list[str], in_flight: list[str],
                 held: dict[str, str | None], control: int | None, timeout_s: float) -> None:
    dead = not pid_alive(failover.pid)
    if not (dead and failover.happened and in_flight):
        result.fail(ids[0], "did_nothing", f"primary pid {failover.pid} dead={dead}, master {failover.old} -> "
                                           f"{failover.new}, {len(in_flight)} runs in flight: no failover under load")
    else:
        result.acted += 1
    if failover.promoted_ms is not None:
        result.latency("failover (kill -> new master)", failover.promoted_ms - failover.killed_ms)
    ended = wait_terminal(ids, timeout_s)
    done_ms = time.time() * 1000
    if not ended:
        result.notes.append(f"not every run ended within {timeout_s:.0f} s of the failover")
    else:
        result.latency("recovery (kill -> every run ended)", done_ms - failover.killed_ms)
    # Events are in Redis: the failover may have lost some of the live view (judged below, not failed).
    judge(result, ids, control, check_events=False)
    for run_id in held:
        claims = [e.at_ms for e in ledger.history(run_id) if e.kind in CLAIMS and e.at_ms > failover.killed_ms]
        if claims:
            result.latency("takeover (kill -> next claim)", min(claims) - failover.killed_ms)
    swept = [r for r in ids if any(_rescue_after(r, failover.killed_ms))]
    # A final event lost with the primary never comes: a second is ample for one still on its way.
    lost_views = [r for r in ids if check_run(r, check_events=True, final_event_grace_s=1.0).failed.get("stream")]
    result.notes.append(
        f"failover {failover.old[1]} -> {failover.new and failover.new[1]}: {len(in_flight)} runs in flight, "
        f"{len(held)} held; {len(swept)} rescued by the sweeper ('{SWEEPER_RESCUE} ...'); {len(lost_views)} live "
        f"views missing events lost with the primary; still unfinished: {len(_in_flight(ids))}")


def _running(ids: list[str], at_least: int) -> bool:
    return sum(r.state == "running" for r in rows(ids)) >= at_least


@contextmanager
def _supervised(cluster: Cluster, every_s: float = 0.2) -> Iterator[list[str]]:
    """Restart a worker that exited on its own, as systemd's Restart=always or Kubernetes would; yields
    the names restarted (one entry per restart). Stops before the cluster closes its nodes."""
    restarts: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(every_s):
            for node in list(cluster.nodes):
                if node.pid is not None and not node.alive and not stop.is_set():
                    restarts.append(node.name)
                    try:
                        node.start()
                    except (RuntimeError, TimeoutError):
                        pass  # tried again at the next look

    thread = threading.Thread(target=watch, name="chaos-supervisor", daemon=True)
    thread.start()
    try:
        yield restarts
    finally:
        stop.set()
        thread.join(35)


def _broker_note(nodes: list[WorkerNode], marks: dict[str, int], restarts: list[str]) -> str:
    """What each worker's Celery consumer did about the broker's failover, from its log."""
    parts = []
    for node in nodes:
        text = node.logs(since=marks.get(str(node.name), 0))
        parts.append(f"{node.name}: lost the broker {text.count('Connection to broker lost')}x, exited on "
                     f"'{KOMBU_CLOSE_CRASH}' {text.count(KOMBU_CLOSE_CRASH)}x, "
                     f"connected again {text.count(RECONNECTED)}x "
                     f"(by itself, or as a restarted worker after an exit)")
    return f"broker failover per worker: {'; '.join(parts)}; restarted by the supervisor so far: {restarts or 'none'}"


def _rescue_after(run_id: str, after_ms: float) -> list[str]:
    return [e.reason for e in ledger.history(run_id) if e.kind == "rescue" and e.at_ms > after_ms
            and e.reason.startswith(SWEEPER_RESCUE)]


SCENARIOS["redis-failover"] = redis_failover
