"""The chaos scenarios: kill (the acceptance test), zombie, wipe, db-restart, poison, rolling, child-kill,
redis-blip, hang.

Every scenario proves it did something: `result.acted` counts the kills, freezes, wipes, restarts and
blips that hit a run in flight, a kill round or child kill that hit nothing is tried again, and one that
still hits nothing fails with condition `did_nothing`. Takeover bounds (`Bounds`, derived from the
ChaosConfig) are failures with condition `bound`, so `fenced chaos` enforces them as the tests do.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial

from chaos.harness import (
    QUERIES,
    ChaosConfig,
    Cluster,
    clear_faults,
    control_charge,
    judge,
    last_events,
    owner_pid,
    resumed_at_ms,
    rows,
    wait_for,
    wait_terminal,
    watch_state,
)
from chaos.nodes import DatabaseNode, RedisNode, WorkerNode
from chaos.report import ScenarioResult, percentile
from checkpoints import ledger
from checkpoints.schema import TERMINAL_STATES
from fenced_core.settings import get_settings
from fencing import faults, keys
from fencing.connection import get_redis

# The four kill moments, covered in turn over the rounds. The first two are read from the event
# stream (the step's newest event); the last two have no duration of their own, so a named fault
# point holds the worker there and the harness kills it.
MOMENTS = ("model_call", "tools", "between_checkpoints", "after_terminal_write")
Progress = Callable[[str], None]
TRIES = 3  # a kill round (or child kill) that hit no run in flight is tried this many times in all
KILL_P95_FAST_MS = 3_000  # whole-worker kill -> task_resumed, p95, with fast takeover on
CHILD_KILL_FAST_MS = 1_000  # pool child kill -> task_resumed, every run: the parent's rescue is immediate
SWEEPER_RESCUE = "no lease and no progress"  # how fencing.sweeper's rescues begin in the ledger
CHILD_RESCUE = "pool child "  # how fencing.liveness.child_died's rescues begin


@dataclass(frozen=True)
class Bounds:
    """The takeover bounds a chaos run enforces (condition `bound`), derived from its ChaosConfig."""

    fast_takeover: bool
    kill_p95_ms: int  # whole-worker SIGKILL -> task_resumed, p95 over the scenario
    child_kill_ms: int  # pool child SIGKILL -> task_resumed, each run
    freeze_min_ms: int  # a freeze is never taken over sooner: lease - heartbeat (the last renewal's age)


def bounds(cfg: ChaosConfig) -> Bounds:
    """With fast takeover a dead process is taken over in about a second, whatever the lease; lease-only,
    within two leases and a reaper tick (+2 s for a busy machine). A frozen process always waits for its
    lease, which counts from its last renewal: at most one heartbeat before the freeze."""
    env = cfg.worker_env()
    fast = env.get("FENCED_FAST_TAKEOVER", "true").strip().lower() not in ("0", "false", "no", "off", "f", "n")
    # Lease-only, the first rescue's wake-up can be lost with the killed worker's pending queue read (or
    # swallowed by a frozen one); the rescue watch sends it again one lease later (seen in CI: 6.9 s at a
    # 3 s lease). So: two leases and a tick, +2 s for a busy machine.
    lease_only = 2 * cfg.lease_ms + int(env["FENCED_REAPER_TICK_MS"]) + 2_000
    return Bounds(fast_takeover=fast,
                  kill_p95_ms=min(KILL_P95_FAST_MS, lease_only) if fast else lease_only,
                  child_kill_ms=min(CHILD_KILL_FAST_MS, lease_only) if fast else lease_only,
                  freeze_min_ms=cfg.lease_ms - int(env["FENCED_HEARTBEAT_MS"]))


def _in_flight(ids: list[str]) -> list[str]:
    return [r.run_id for r in rows(ids) if r.state not in TERMINAL_STATES]


def _rescues(run_id: str, reason_prefix: str) -> list[str]:
    return [e.reason for e in ledger.history(run_id) if e.kind == "rescue" and e.reason.startswith(reason_prefix)]


def _submit() -> Callable[[str, str], str]:
    """submit_run with users unique to this chaos run (every user starts with a fresh balance)."""
    import uuid

    from tasks import submit_run

    nonce = uuid.uuid4().hex[:6]
    return lambda user, query: submit_run(f"{user}-{nonce}", query)


@contextmanager
def _cluster(cfg: ChaosConfig, faults_armed: bool = False) -> Iterator[tuple[Cluster, Callable[[str, str], str]]]:
    """A scenario's cluster (closed at the end, whatever happened) and its submit; disarms the fault
    points afterwards when the scenario armed any."""
    cluster = Cluster(cfg)
    try:
        yield cluster, _submit()
    finally:
        if faults_armed:
            clear_faults()
        cluster.close()


def kill(cfg: ChaosConfig, rounds: int = 30, runs: int = 6, progress: Progress = print) -> ScenarioResult:
    """SIGKILL the worker holding the most runs at one of four moments, every round; judge every run.

    A round whose kill hit no run in flight is tried again with fresh runs (TRIES in all), then fails
    `did_nothing`. Bound: the p95 of kill -> task_resumed over the scenario (Bounds.kill_p95_ms)."""
    bound = bounds(cfg)
    result = ScenarioResult("kill", {"rounds": rounds, "runs": runs, "lease_ms": cfg.lease_ms,
                                     "fast_takeover": bound.fast_takeover, "bound_p95_ms": bound.kill_p95_ms})
    taken: list[tuple[float, str]] = []
    with _cluster(cfg, faults_armed=True) as (cluster, submit):
        cluster.start(2)
        control = control_charge(submit, cfg.timeout_s)
        for rnd in range(rounds):
            moment = MOMENTS[rnd % len(MOMENTS)]
            for attempt in range(TRIES):
                ids = [submit(f"chaos-{rnd}-{attempt}-{i}", QUERIES[i % len(QUERIES)]) for i in range(runs)]
                victim, kill_ms, held = _kill_at(cluster, ids, moment)
                if victim is not None:
                    time.sleep(2)  # the killed worker comes back a few seconds later
                    victim.restart()
                if not wait_terminal(ids, cfg.timeout_s):
                    result.notes.append(f"round {rnd}: not every run ended within {cfg.timeout_s:.0f} s")
                judge(result, ids, control)
                for run_id in held if moment != "after_terminal_write" else []:
                    at = resumed_at_ms(run_id, kill_ms)
                    if at is None:
                        result.fail(run_id, "stream", f"held by the killed worker ({moment}) but no task_resumed")
                    else:
                        result.latency("whole-worker kill", at - kill_ms)
                        taken.append((at - kill_ms, run_id))
                # After the terminal write the run is done, not held: the fault point's hit is the proof.
                if victim is not None and (held or moment == "after_terminal_write"):
                    result.acted += 1
                    break
            else:
                result.fail(ids[0], "did_nothing", f"round {rnd} ({moment}): {TRIES} tries, no kill hit a run in "
                                                   "flight")
            progress(f"kill round {rnd + 1}/{rounds} ({moment}): {len(held)} runs held by the killed worker")
        _p95_bound(result, "whole-worker kill", taken, bound.kill_p95_ms,
                   "fast takeover" if bound.fast_takeover else f"lease-only: lease {cfg.lease_ms} ms + tick + 2 s")
    return result


def _p95_bound(result: ScenarioResult, kind: str, taken: list[tuple[float, str]], bound_ms: int, why: str) -> None:
    """Condition `bound` on the p95 of (latency ms, run) samples, named after the run at the p95."""
    p95 = percentile([ms for ms, _ in taken], 95)
    if p95 is not None and p95 > bound_ms:
        at_p95 = next(run_id for ms, run_id in sorted(taken) if ms >= p95)
        result.fail(at_p95, "bound", f"{kind} takeover p95 {p95:.0f} ms over {len(taken)} runs, bound {bound_ms} ms "
                                     f"({why})")


# Kill moments a fault point holds until the kill (the point each arms); the rest are polled.
_HELD_BY_POINT = {"tools": "in_tool", "between_checkpoints": "after_tools",
                  "after_terminal_write": "after_terminal_write"}


def _kill_at(cluster: Cluster, ids: list[str], moment: str) -> tuple[WorkerNode | None, float, list[str]]:
    """Wait for `moment` on a run of the busiest worker, SIGKILL its process group; (node, kill ms, held runs)."""
    victim: WorkerNode | None = None
    if moment in _HELD_BY_POINT:
        # A fault point holds the moment until the kill: a tool that returns at once (a user's lookup)
        # left a polled "newest event is tool_started" to luck, and a round could miss three times.
        faults.arm(_HELD_BY_POINT[moment])
        hit = faults.next_hit(60)
        clear_faults()
        if hit:
            victim = cluster.node_of(hit[2])
    else:  # the model call: the stub's and a user's model take a while, so polling the stream finds it

        def busiest_at_moment() -> WorkerNode | None:
            live = [r for r in rows(ids) if r.state == "running" and r.owner]
            by_node: dict[str, list[str]] = {}
            nodes: dict[str, WorkerNode] = {}
            for r in live:
                node = cluster.node_of(owner_pid(r.owner) or -1)
                if node is not None:
                    by_node.setdefault(node.name, []).append(r.run_id)
                    nodes[node.name] = node
            if not by_node:
                return None
            name, mine = max(by_node.items(), key=lambda kv: len(kv[1]))
            newest = last_events(mine)
            return nodes[name] if any(t == "step_started" for t, _ in newest.values()) else None

        victim = wait_for(busiest_at_moment, 60, every_s=0.02)
    if victim is None:
        return None, 0.0, []
    owners = {r.run_id: r.owner for r in rows(ids) if r.state == "running" and victim.owns(owner_pid(r.owner) or -1)}
    kill_ms = time.time() * 1000
    victim.kill(signal.SIGKILL)  # returns once the process group is gone: it writes nothing more
    # Read again after the kill: a step the victim finished in between (checkpoint B clears the owner)
    # was handed over, not held, and owes no task_resumed.
    held = [r.run_id for r in rows(list(owners)) if r.state == "running" and r.owner == owners[r.run_id]]
    return victim, kill_ms, held


def zombie(cfg: ChaosConfig, times: int = 10, progress: Progress = print) -> ScenarioResult:
    """Freeze the holder past its lease; the new holder finishes; after SIGCONT the old one is refused.

    Even rounds SIGSTOP the holder from outside mid-step and wake it after the run ended (its next
    write is usually an event, fenced by the Redis epoch mirror); odd rounds make it stop itself right
    before checkpoint A and wake it as soon as the new holder took over, so its first write after
    SIGCONT is the database's fenced UPDATE on a row that is still running.

    Bound: no freeze is taken over sooner than lease - heartbeat after it began (Bounds.freeze_min_ms):
    a holder that is alive, only slow, keeps its run for its lease."""
    bound = bounds(cfg)
    result = ScenarioResult("zombie", {"times": times, "lease_ms": cfg.lease_ms, "min_freeze_ms": bound.freeze_min_ms})
    slow = replace(cfg, step_ms=max(cfg.step_ms, 1500))
    with _cluster(slow, faults_armed=True) as (cluster, submit):
        cluster.start(2)
        for i in range(times):
            self_stop = i % 2 == 1
            if self_stop:
                faults.arm("before_checkpoint_a", action="stop")
            run_id = submit(f"zombie-{i}", QUERIES[i % len(QUERIES)])
            if self_stop:
                holder, freeze_ms = _stopped_holder(cluster, run_id)
            else:
                holder, freeze_ms, run_id = _freeze_a_holder(cluster, submit, run_id, i, slow)
            if holder is None:
                result.fail(run_id, "did_nothing", "no worker held the run when frozen: nothing was frozen")
                result.runs += 1
                continue
            if self_stop:
                # Woken as soon as the new holder took over, while it is still mid-run: its checkpoint A
                # write meets a live row, so only the epoch (not the run's state) can refuse it.
                wait_for(partial(resumed_at_ms, run_id, freeze_ms), slow.timeout_s)
                woken_ms = time.time() * 1000
                holder.kill(signal.SIGCONT)
            ended = wait_terminal([run_id], slow.timeout_s)
            if not self_stop:
                woken_ms = time.time() * 1000
            holder.kill(signal.SIGCONT)
            at = resumed_at_ms(run_id, freeze_ms)
            if at is not None:
                result.latency("freeze (SIGSTOP)", at - freeze_ms)
                if at - freeze_ms < bound.freeze_min_ms:
                    result.fail(run_id, "bound", f"a frozen holder was taken over {at - freeze_ms:.0f} ms after the "
                                                 f"freeze, sooner than lease - heartbeat = {bound.freeze_min_ms} ms")
            # The frozen deliveries: the holder's claims from before it was woken. Woken mid-run, the same
            # process may claim later steps of the run legitimately, under new tokens and epochs.
            mine = {e.actor for e in ledger.history(run_id) if e.kind in ("claimed", "takeover")
                    and holder.owns(owner_pid(e.actor) or -1) and e.at_ms < woken_ms}
            refused = wait_for(partial(_refused, run_id, mine), 15, every_s=0.2)
            judge(result, [run_id], None)
            finals = [e for e in ledger.history(run_id) if e.kind == "done"]
            if not ended or not refused:
                result.fail(run_id, "zombie", f"ended={ended}, old holder refused={bool(refused)}")
            if at is not None and refused:
                result.acted += 1  # frozen, taken over, and its write after waking refused
            if any(e.actor in mine for e in finals):
                result.fail(run_id, "zombie", "the frozen holder wrote the terminal state")
            how = "stopped itself before checkpoint A" if self_stop else "SIGSTOP mid-step"
            progress(f"zombie {i + 1}/{times} ({how}): {'refused' if refused else 'NOT refused'}")
    return result


def _freeze_a_holder(cluster: Cluster, submit: Callable[[str, str], str], run_id: str, i: int,
                     cfg: ChaosConfig, tries: int = 3) -> tuple[WorkerNode | None, float, str]:
    """SIGSTOP the worker holding `run_id` mid-step. A holder that handed the step over between the look
    and the stop froze with nothing in flight: it is woken, and the round goes again with a fresh run."""
    for attempt in range(tries):
        holder = wait_for(partial(_holder, cluster, run_id), 30)
        if holder is None:
            return None, 0.0, run_id
        freeze_ms = time.time() * 1000
        holder.kill(signal.SIGSTOP)
        time.sleep(0.05)
        if _holder(cluster, run_id) is holder:
            return holder, freeze_ms, run_id
        holder.kill(signal.SIGCONT)
        wait_terminal([run_id], cfg.timeout_s)
        if attempt + 1 < tries:
            run_id = submit(f"zombie-{i}-again-{attempt}", QUERIES[i % len(QUERIES)])
    return None, 0.0, run_id


def _stopped_holder(cluster: Cluster, run_id: str) -> tuple[WorkerNode | None, float]:
    """The node that stopped itself at the armed point, and when the freeze began at the latest: its last
    event before the point (Redis clock), or when the hit was seen, whichever is earlier."""
    hit = faults.next_hit(60)
    seen_ms = time.time() * 1000
    if not hit:
        return None, seen_ms
    node = cluster.node_of(hit[2])
    last = last_events([run_id]).get(run_id)
    time.sleep(0.2)  # the SIGSTOP it sent itself lands
    return node, min(seen_ms, last[1]) if last else seen_ms


def _holder(cluster: Cluster, run_id: str) -> WorkerNode | None:
    return next((cluster.node_of(owner_pid(r.owner) or -1) for r in rows([run_id]) if r.owner), None)


def _refused(run_id: str, tokens: set[str]) -> bool:
    return any(e.kind == "fence_rejected" and e.actor in tokens for e in ledger.history(run_id))


def wipe(cfg: ChaosConfig, runs: int = 8, progress: Progress = print) -> ScenarioResult:
    """FLUSHALL while runs are in flight: every run still finishes, through the sweeper (its rescue must be
    in the ledger of at least one run, or the wipe hit nothing the sweeper had to find).

    The workers have slots for about two thirds of the runs, so some wait in the queue when Redis is
    flushed: their wake-ups are lost with it and only the sweeper can find them. (A holder whose lease
    vanished under it notices at its next renewal and has its run rescued without the sweeper.)"""
    result = ScenarioResult("wipe", {"runs": runs, "lease_ms": cfg.lease_ms})
    with _cluster(replace(cfg, concurrency=max(1, runs // 3))) as (cluster, submit):
        cluster.start(2)
        ids = [submit(f"wipe-{i}", QUERIES[i % len(QUERIES)]) for i in range(runs)]
        wait_for(lambda: sum(r.step >= 1 for r in rows(ids)) >= runs // 2, 60)
        in_flight = _in_flight(ids)
        RedisNode(get_settings().redis_url).flush()
        progress(f"wipe: Redis flushed with {len(in_flight)} runs in flight")
        wait_terminal(ids, cfg.timeout_s + get_settings().sweeper_grace_ms / 1000)
        judge(result, ids, None, check_events=False)
        swept = [run_id for run_id in ids if _rescues(run_id, SWEEPER_RESCUE)]
        if swept:
            result.acted += 1
            result.notes.append(f"{len(swept)} of {len(in_flight)} runs in flight rescued by the sweeper")
        else:
            result.fail(ids[0], "did_nothing", f"no run was rescued by the sweeper ('{SWEEPER_RESCUE} ...') after "
                                               f"the wipe ({len(in_flight)} runs were in flight)")
    return result


def db_restart(cfg: ChaosConfig, runs: int = 8, progress: Progress = print) -> ScenarioResult:
    """Restart MariaDB mid-flight: workers ride it out; nothing is lost or doubled."""
    result = ScenarioResult("db-restart", {"runs": runs, "lease_ms": cfg.lease_ms})
    db = DatabaseNode()
    if not get_settings().is_mysql or not db.available():
        result.notes.append("skipped: the run store is not a local MariaDB this harness can restart")
        return result
    with _cluster(cfg) as (cluster, submit):
        cluster.start(2)
        control = control_charge(submit, cfg.timeout_s)
        ids = [submit(f"db-{i}", QUERIES[i % len(QUERIES)]) for i in range(runs)]
        wait_for(lambda: sum(r.step >= 1 for r in rows(ids)) >= runs // 2, 60)
        marks = {node.name: node.log_mark() for node in cluster.nodes}
        in_flight = _in_flight(ids)
        back_s = db.restart(down_s=3)
        progress(f"db-restart: MariaDB down 3 s with {len(in_flight)} runs in flight, answering again after "
                 f"{back_s:.1f} s")
        wait_terminal(ids, cfg.timeout_s + 60)
        judge(result, ids, control)
        # checkpoints.db logs `db_retry` before each retry of a transaction: the proof a worker met the outage.
        retried = {node.name: node.logs(since=marks.get(node.name, 0)).count("event='db_retry'")
                   for node in cluster.nodes}
        if any(retried.values()):
            result.acted += 1
            result.notes.append(f"db_retry lines logged per worker: {retried}")
        else:
            result.fail(ids[0], "did_nothing", f"no worker logged a db_retry: the restart met no transaction "
                                               f"({len(in_flight)} runs were in flight)")
    return result


def poison(cfg: ChaosConfig, runs: int = 5, progress: Progress = print) -> ScenarioResult:
    """A run that kills its process every time goes dead after 3 deliveries; its neighbours finish."""
    result = ScenarioResult("poison", {"runs": runs, "lease_ms": cfg.lease_ms})
    with _cluster(cfg) as (cluster, submit):
        cluster.start(2, pool="prefork")
        bad = submit("poison", "buy [poison] headphones")
        ids = [submit(f"neighbour-{i}", QUERIES[i % len(QUERIES)]) for i in range(runs)]
        wait_terminal([bad, *ids], cfg.timeout_s + 4 * cfg.lease_ms / 1000)
        judge(result, [bad], None, expect="dead")
        judge(result, ids, None)
        # Every delivery after the first crash is a takeover: each one followed a process the run killed.
        crashes = sum(e.kind == "takeover" for e in ledger.history(bad))
        result.acted += crashes
        if not crashes:
            result.fail(bad, "did_nothing", "the poison run never crashed its process")
        progress(f"poison: dead-lettered; {runs} neighbours judged")
    return result


ROLLING_NODES = 3


def rolling(cfg: ChaosConfig, runs: int = 12, progress: Progress = print) -> ScenarioResult:
    """Restart every worker in turn (SIGTERM, drain, start) under load: no run is interrupted or lost.

    Each node is stopped only once it holds a step in flight (a running row whose owner is its process),
    with a batch of runs/3 submitted for it; a node that never holds one fails `did_nothing`."""
    result = ScenarioResult("rolling", {"runs": runs, "lease_ms": cfg.lease_ms})
    with _cluster(cfg) as (cluster, submit):
        nodes = cluster.start(ROLLING_NODES)
        ids: list[str] = []
        per = max(1, runs // len(nodes))

        def batch(label: str) -> list[str]:
            return [submit(f"rolling-{label}-{i}", QUERIES[i % len(QUERIES)]) for i in range(per)]

        for k, node in enumerate(nodes):
            ids += batch(str(k))
            held = _wait_holding(node, ids, partial(_top_up, batch, f"{k}-more"))
            if held:
                result.acted += 1
            else:
                result.fail(ids[-1], "did_nothing", f"{node.name} never held a step in flight: its SIGTERM drained "
                                                     "nothing")
            node.stop()
            node.start()
            progress(f"rolling: {node.name} restarted; it held {len(held)} step(s) in flight at its SIGTERM")
        wait_terminal(ids, cfg.timeout_s)
        judge(result, ids, None)
        for run_id in ids:
            if any(e.kind == "takeover" for e in ledger.history(run_id)):
                result.fail(run_id, "rolling", "interrupted: a drain should finish the step, not leave it")
    return result


def _wait_holding(node: WorkerNode, ids: list[str], more: Callable[[int], list[str]], timeout_s: float = 30,
                  top_ups: int = 6) -> list[str]:
    """Wait until `node` holds a step of one of `ids` in flight (a running row whose owner is its process).
    Meanwhile the load is kept up: while fewer of `ids` are unfinished than there are workers, `more(n)`
    submits the n-th top-up (appended to `ids`). Under FENCED_ROUTING=reach a wake-up goes to the
    best-scoring worker, not to whichever is free: one run at a time can keep going to the others while
    `node` idles; with a run in flight on each of them, the idle `node` scores best. Returns the runs held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = rows(ids)
        held = [r.run_id for r in found if r.state == "running" and node.owns(owner_pid(r.owner) or -1)]
        if held:
            return held
        live = [r for r in found if r.state not in TERMINAL_STATES]
        if top_ups and found and len(live) < ROLLING_NODES:
            top_ups -= 1
            ids += more(top_ups)
        time.sleep(0.02)
    return []


def _top_up(batch: Callable[[str], list[str]], label: str, n: int) -> list[str]:
    return batch(f"{label}-{n}")


def child_kill(cfg: ChaosConfig, times: int = 10, progress: Progress = print) -> ScenarioResult:
    """OOM-style: SIGKILL one prefork pool child mid-step (the parent lives on); time kill -> task_resumed.

    Prefork workers only, and every round kills a child holding the run's step (a round where none did
    is tried again, TRIES in all, then fails `did_nothing`). With fast takeover the parent's rescue
    (`pool child <pid> died ...`) must be in the run's ledger and the takeover within Bounds.child_kill_ms."""
    bound = bounds(cfg)
    result = ScenarioResult("child-kill", {"times": times, "lease_ms": cfg.lease_ms,
                                           "fast_takeover": bound.fast_takeover, "bound_ms": bound.child_kill_ms})
    slow = replace(cfg, step_ms=max(cfg.step_ms, 800))
    with _cluster(slow) as (cluster, submit):
        [parent] = cluster.start(1, pool="prefork", prefix="p")
        for i in range(times):
            for attempt in range(TRIES):
                run_id = submit(f"child-{i}-{attempt}", QUERIES[i % len(QUERIES)])
                killed = _kill_child(parent, run_id)
                if killed is None:
                    wait_terminal([run_id], slow.timeout_s)
                    judge(result, [run_id], None)
                    continue
                pid, kill_ms = killed
                if not parent.alive:
                    result.fail(run_id, "child-kill", f"the worker died with its pool child {pid}")
                wait_terminal([run_id], slow.timeout_s)
                at = resumed_at_ms(run_id, kill_ms)
                if at is None:
                    result.fail(run_id, "stream", f"pool child {pid} killed mid-step but no task_resumed")
                else:
                    result.latency("pool child kill", at - kill_ms)
                    if at - kill_ms > bound.child_kill_ms:
                        result.fail(run_id, "bound", f"pool child kill taken over after {at - kill_ms:.0f} ms, bound "
                                                     f"{bound.child_kill_ms} ms")
                if bound.fast_takeover and not _rescues(run_id, f"{CHILD_RESCUE}{pid} died"):
                    result.fail(run_id, "child-kill", f"no '{CHILD_RESCUE}{pid} died' rescue in the ledger: the "
                                                      "parent did not act on its child's death")
                judge(result, [run_id], None)
                result.acted += 1
                break
            else:
                result.fail(run_id, "did_nothing", f"kill {i + 1}: {TRIES} tries, no pool child held the run mid-step")
            progress(f"child-kill {i + 1}/{times}")
    return result


def _kill_child(parent: WorkerNode, run_id: str) -> tuple[int, float] | None:
    """SIGKILL the pool child of `parent` holding `run_id`'s step; (child pid, kill ms), or None if no child
    held it (it never got one, or the step ended before the kill landed)."""

    def child_owner() -> str | None:
        owner = next((r.owner for r in rows([run_id]) if r.state == "running" and r.owner), None)
        pid = owner_pid(owner)
        return owner if pid and pid != parent.pid and parent.owns(pid) else None

    owner = wait_for(child_owner, 30, every_s=0.02)
    pid = owner_pid(owner)
    if owner is None or pid is None:
        return None
    kill_ms = time.time() * 1000
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    # Mid-step only if the row still names that child after the kill (checkpoint B clears the owner).
    if not any(r.state == "running" and r.owner == owner for r in rows([run_id])):
        return None
    return pid, kill_ms


def redis_blip(cfg: ChaosConfig, runs: int = 8, progress: Progress = print) -> ScenarioResult:
    """Drop every client connection of Redis (CLIENT KILL), as a restart that keeps its data or a network
    blip would, five times under load: every run finishes, and fast takeover's false positives are counted."""
    result = ScenarioResult("redis-blip", {"runs": runs, "lease_ms": cfg.lease_ms})
    with _cluster(cfg) as (cluster, submit):
        cluster.start(2)
        ids = [submit(f"blip-{i}", QUERIES[i % len(QUERIES)]) for i in range(runs)]
        wait_for(lambda: sum(r.step >= 1 for r in rows(ids)) >= 1, 60)
        for n in range(5):
            in_flight = _in_flight(ids)
            get_redis().execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            result.acted += bool(in_flight)
            progress(f"redis-blip: every client connection dropped ({n + 1}/5)")
            time.sleep(1)
        wait_terminal(ids, cfg.timeout_s)
        judge(result, ids, None)
    return result


def hang(cfg: ChaosConfig, times: int = 5, progress: Progress = print) -> ScenarioResult:
    """A step that never returns (a tool or HTTP call without a timeout), on the configured pool (threads
    unless `fenced chaos --pool`) and on prefork: the run is taken over after step timeout + lease (and the
    hung thread, when it wakes, is fenced out); a step that hangs at every delivery is dead-lettered after
    max_deliveries."""
    step_timeout_s = 1
    result = ScenarioResult("hang", {"times": times, "lease_ms": cfg.lease_ms, "step_timeout_s": step_timeout_s})
    bound_ms = step_timeout_s * 1000 + cfg.lease_ms + 2000
    for pool in (cfg.pool, "prefork"):
        with _cluster(cfg, faults_armed=True) as (cluster, submit):
            cluster.start(2, pool=pool, FENCED_STEP_TIMEOUT_S=str(step_timeout_s))
            for i in range(times):
                # Wakes after the takeover, so its next write meets the newer epoch.
                faults.arm("after_model_call", action="hang", hang_s=step_timeout_s + cfg.lease_ms / 1000 + 3)
                run_id = submit(f"hang-{pool}-{i}", QUERIES[i % len(QUERIES)])
                hit = faults.next_hit(30)
                if hit is None or hit[1] != run_id:
                    result.fail(run_id, "did_nothing", "no step hung: the scenario did nothing")
                    continue
                result.acted += 1
                hung_ms = time.time() * 1000
                late = _late_takeover(run_id, hung_ms, bound_ms)
                if late:
                    result.notes.append(f"{run_id}: not taken over at the bound; then {late}")
                wait_terminal([run_id], cfg.timeout_s)
                at = resumed_at_ms(run_id, hung_ms)
                history = ledger.history(run_id)
                if not any(e.kind == "step_timeout" for e in history):
                    result.fail(run_id, "hang", "no step_timeout in the ledger: the lease was never let go")
                if at is None:
                    result.fail(run_id, "stream", "a hung step but no task_resumed")
                else:
                    result.latency(f"{pool} hang takeover", at - hung_ms)
                    if at - hung_ms > bound_ms:
                        result.fail(run_id, "bound", f"taken over {at - hung_ms:.0f} ms after the hang "
                                                     f"(bound: step timeout + lease + 2 s = {bound_ms} ms)")
                judge(result, [run_id], None)
                progress(f"hang ({pool}) {i + 1}/{times}")
            faults.arm("after_model_call", times=get_settings().max_deliveries, action="hang")
            bad = submit(f"hang-always-{pool}", QUERIES[0])
            wait_terminal([bad], cfg.timeout_s)
            judge(result, [bad], None, expect="dead")
            if last_events([bad]).get(bad, ("", 0))[0] != "run_dead":
                result.fail(bad, "stream", "dead-lettered, but the stream does not end with run_dead")
            progress(f"hang ({pool}): a step hanging at every delivery was dead-lettered")
    return result


def _late_takeover(run_id: str, hung_ms: float, bound_ms: float) -> str | None:
    """Waits until the run is taken over or the bound passes; at the bound, what watches the run in
    Redis (so a late takeover says why), else None."""
    while time.time() * 1000 < hung_ms + bound_ms:
        if resumed_at_ms(run_id, hung_ms) is not None:
            return None
        time.sleep(0.25)
    return None if resumed_at_ms(run_id, hung_ms) is not None else watch_state(run_id)


SCENARIOS = {"kill": kill, "zombie": zombie, "wipe": wipe, "db-restart": db_restart, "poison": poison,
             "rolling": rolling, "child-kill": child_kill, "redis-blip": redis_blip, "hang": hang}


def run(name: str, cfg: ChaosConfig, progress: Progress = print, **kwargs: int) -> ScenarioResult:
    """Run one scenario, timing it and counting fast-takeover false positives it caused."""
    client = get_redis()
    before = int(client.get(keys.FALSE_POSITIVES) or 0)
    started = time.monotonic()
    result = SCENARIOS[name](cfg, progress=progress, **kwargs)  # type: ignore[operator]
    result.elapsed_s = time.monotonic() - started
    if cfg.pool != "threads":
        result.params["pool"] = cfg.pool
    result.false_positives = int(get_redis().get(keys.FALSE_POSITIVES) or 0) - before
    return result
