"""The chaos scenarios: kill (the acceptance test), zombie, wipe, db-restart, poison, rolling."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
)
from chaos.nodes import DatabaseNode, RedisNode, WorkerNode
from chaos.report import ScenarioResult
from checkpoints import ledger
from fenced import faults
from fenced.settings import get_settings
from fencing import keys
from fencing.connection import get_redis

# The four kill moments, covered in turn over the rounds. The first two are read from the event
# stream (the step's newest event); the last two have no duration of their own, so a named fault
# point holds the worker there and the harness kills it.
MOMENTS = ("model_call", "tools", "between_checkpoints", "after_terminal_write")
Progress = Callable[[str], None]


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
    """SIGKILL the worker holding the most runs at one of four moments, every round; judge every run."""
    result = ScenarioResult("kill", {"rounds": rounds, "runs": runs, "lease_ms": cfg.lease_ms})
    with _cluster(cfg, faults_armed=True) as (cluster, submit):
        cluster.start(2)
        control = control_charge(submit, cfg.timeout_s)
        for rnd in range(rounds):
            moment = MOMENTS[rnd % len(MOMENTS)]
            ids = [submit(f"chaos-{rnd}-{i}", QUERIES[i % len(QUERIES)]) for i in range(runs)]
            victim, kill_ms, held = _kill_at(cluster, ids, moment)
            if victim is None:
                result.notes.append(f"round {rnd}: no worker reached {moment}; nothing killed")
            else:
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
            progress(f"kill round {rnd + 1}/{rounds} ({moment}): {len(held)} runs held by the killed worker")
    return result


def _kill_at(cluster: Cluster, ids: list[str], moment: str) -> tuple[WorkerNode | None, float, list[str]]:
    """Wait for `moment` on a run of the busiest worker, SIGKILL its process group; (node, kill ms, held runs)."""
    victim: WorkerNode | None = None
    if moment in ("between_checkpoints", "after_terminal_write"):
        faults.arm("after_tools" if moment == "between_checkpoints" else "after_terminal_write")
        hit = faults.next_hit(60)
        clear_faults()
        if hit:
            victim = cluster.node_of(hit[2])
    else:
        wanted = "step_started" if moment == "model_call" else "tool_started"

        def busiest_at_moment() -> WorkerNode | None:
            live = [r for r in rows(ids) if r.state == "running" and r.owner]
            by_node: dict[str, list[str]] = {}
            nodes = {}
            for r in live:
                node = cluster.node_of(owner_pid(r.owner) or -1)
                if node is not None:
                    by_node.setdefault(node.name, []).append(r.run_id)
                    nodes[node.name] = node
            if not by_node:
                return None
            name, mine = max(by_node.items(), key=lambda kv: len(kv[1]))
            newest = last_events(mine)
            return nodes[name] if any(t == wanted for t, _ in newest.values()) else None

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
    SIGCONT is the database's fenced UPDATE on a row that is still running."""
    result = ScenarioResult("zombie", {"times": times, "lease_ms": cfg.lease_ms})
    slow = ChaosConfig(**{**cfg.__dict__, "step_ms": max(cfg.step_ms, 1500)})
    with _cluster(slow, faults_armed=True) as (cluster, submit):
        cluster.start(2)
        for i in range(times):
            self_stop = i % 2 == 1
            if self_stop:
                faults.arm("before_checkpoint_a", action="stop")
            run_id = submit(f"zombie-{i}", QUERIES[i % len(QUERIES)])
            holder = _stopped_holder(cluster) if self_stop else wait_for(partial(_holder, cluster, run_id), 30)
            if holder is None:
                result.fail(run_id, "zombie", "no worker claimed the run")
                result.runs += 1
                continue
            freeze_ms = time.time() * 1000
            if not self_stop:
                holder.kill(signal.SIGSTOP)
            if self_stop:
                # Woken as soon as the new holder took over, while it is still mid-run: its checkpoint A
                # write meets a live row, so only the epoch (not the run's state) can refuse it.
                wait_for(partial(resumed_at_ms, run_id, freeze_ms), slow.timeout_s)
                holder.kill(signal.SIGCONT)
            ended = wait_terminal([run_id], slow.timeout_s)
            holder.kill(signal.SIGCONT)
            at = resumed_at_ms(run_id, freeze_ms)
            if at is not None:
                result.latency("freeze (SIGSTOP)", at - freeze_ms)
            mine = {e.actor for e in ledger.history(run_id) if e.kind in ("claimed", "takeover")
                    and holder.owns(owner_pid(e.actor) or -1)}
            refused = wait_for(partial(_refused, run_id, mine), 15, every_s=0.2)
            judge(result, [run_id], None)
            finals = [e for e in ledger.history(run_id) if e.kind == "done"]
            if not ended or not refused:
                result.fail(run_id, "zombie", f"ended={ended}, old holder refused={bool(refused)}")
            if any(e.actor in mine for e in finals):
                result.fail(run_id, "zombie", "the frozen holder wrote the terminal state")
            how = "stopped itself before checkpoint A" if self_stop else "SIGSTOP mid-step"
            progress(f"zombie {i + 1}/{times} ({how}): {'refused' if refused else 'NOT refused'}")
    return result


def _stopped_holder(cluster: Cluster) -> WorkerNode | None:
    hit = faults.next_hit(60)
    if not hit:
        return None
    node = cluster.node_of(hit[2])
    time.sleep(0.2)  # the SIGSTOP it sent itself lands
    return node


def _holder(cluster: Cluster, run_id: str) -> WorkerNode | None:
    return next((cluster.node_of(owner_pid(r.owner) or -1) for r in rows([run_id]) if r.owner), None)


def _refused(run_id: str, tokens: set[str]) -> bool:
    return any(e.kind == "fence_rejected" and e.actor in tokens for e in ledger.history(run_id))


def wipe(cfg: ChaosConfig, runs: int = 8, progress: Progress = print) -> ScenarioResult:
    """FLUSHALL while runs are in flight: every run still finishes, through the sweeper."""
    result = ScenarioResult("wipe", {"runs": runs, "lease_ms": cfg.lease_ms})
    with _cluster(cfg) as (cluster, submit):
        cluster.start(2)
        ids = [submit(f"wipe-{i}", QUERIES[i % len(QUERIES)]) for i in range(runs)]
        wait_for(lambda: sum(r.step >= 1 for r in rows(ids)) >= runs // 2, 60)
        RedisNode(get_settings().redis_url).flush()
        progress("wipe: Redis flushed with runs in flight")
        wait_terminal(ids, cfg.timeout_s + get_settings().sweeper_grace_ms / 1000)
        judge(result, ids, None, check_events=False)
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
        back_s = db.restart(down_s=3)
        progress(f"db-restart: MariaDB down 3 s, answering again after {back_s:.1f} s")
        wait_terminal(ids, cfg.timeout_s + 60)
        judge(result, ids, control)
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
        progress(f"poison: dead-lettered; {runs} neighbours judged")
    return result


def rolling(cfg: ChaosConfig, runs: int = 12, progress: Progress = print) -> ScenarioResult:
    """Restart every worker in turn (SIGTERM, drain, start) under load: no run is interrupted or lost."""
    result = ScenarioResult("rolling", {"runs": runs, "lease_ms": cfg.lease_ms})
    with _cluster(cfg) as (cluster, submit):
        nodes = cluster.start(3)
        ids = [submit(f"rolling-{i}", QUERIES[i % len(QUERIES)]) for i in range(runs)]
        for node in nodes:
            time.sleep(1)
            node.stop()
            node.start()
            progress(f"rolling: {node.name} restarted")
        wait_terminal(ids, cfg.timeout_s)
        judge(result, ids, None)
        for run_id in ids:
            if any(e.kind == "takeover" for e in ledger.history(run_id)):
                result.fail(run_id, "rolling", "interrupted: a drain should finish the step, not leave it")
    return result


def child_kill(cfg: ChaosConfig, times: int = 10, progress: Progress = print) -> ScenarioResult:
    """OOM-style: SIGKILL one prefork pool child mid-step (the parent lives on); time kill -> task_resumed."""
    import os

    result = ScenarioResult("child-kill", {"times": times, "lease_ms": cfg.lease_ms})
    slow = ChaosConfig(**{**cfg.__dict__, "step_ms": max(cfg.step_ms, 800)})
    with _cluster(slow) as (cluster, submit):
        [parent] = cluster.start(1, pool="prefork", prefix="p")
        cluster.start(1)
        for i in range(times):
            run_id = submit(f"child-{i}", QUERIES[i % len(QUERIES)])

            def child_pid(r: str = run_id) -> int | None:
                pid = next((owner_pid(x.owner) for x in rows([r]) if x.owner), None)
                return pid if pid and pid != parent.pid and parent.owns(pid) else None

            pid = wait_for(child_pid, 30)
            if pid is None:  # the threads worker took it: not this scenario's failure kind
                wait_terminal([run_id], slow.timeout_s)
                judge(result, [run_id], None)
                continue
            kill_ms = time.time() * 1000
            os.kill(pid, signal.SIGKILL)
            wait_terminal([run_id], slow.timeout_s)
            at = resumed_at_ms(run_id, kill_ms)
            if at is None:
                result.fail(run_id, "stream", "pool child killed mid-step but no task_resumed")
            else:
                result.latency("pool child kill", at - kill_ms)
            judge(result, [run_id], None)
            progress(f"child-kill {i + 1}/{times}")
    return result


def redis_blip(cfg: ChaosConfig, runs: int = 8, progress: Progress = print) -> ScenarioResult:
    """Drop every client connection of Redis (CLIENT KILL), as a restart that keeps its data or a network
    blip would, five times under load: every run finishes, and fast takeover's false positives are counted."""
    result = ScenarioResult("redis-blip", {"runs": runs, "lease_ms": cfg.lease_ms})
    with _cluster(cfg) as (cluster, submit):
        cluster.start(2)
        ids = [submit(f"blip-{i}", QUERIES[i % len(QUERIES)]) for i in range(runs)]
        wait_for(lambda: sum(r.step >= 1 for r in rows(ids)) >= 1, 60)
        for n in range(5):
            get_redis().execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            progress(f"redis-blip: every client connection dropped ({n + 1}/5)")
            time.sleep(1)
        wait_terminal(ids, cfg.timeout_s)
        judge(result, ids, None)
    return result


def hang(cfg: ChaosConfig, times: int = 5, progress: Progress = print) -> ScenarioResult:
    """A step that never returns (a tool or HTTP call without a timeout), on the threads and the prefork
    pool: the run is taken over after step timeout + lease (and the hung thread, when it wakes, is fenced
    out); a step that hangs at every delivery is dead-lettered after max_deliveries."""
    step_timeout_s = 1
    result = ScenarioResult("hang", {"times": times, "lease_ms": cfg.lease_ms, "step_timeout_s": step_timeout_s})
    bound_ms = step_timeout_s * 1000 + cfg.lease_ms + 2000
    for pool in ("threads", "prefork"):
        with _cluster(cfg, faults_armed=True) as (cluster, submit):
            cluster.start(2, pool=pool, FENCED_STEP_TIMEOUT_S=str(step_timeout_s))
            for i in range(times):
                # Wakes after the takeover, so its next write meets the newer epoch.
                faults.arm("after_model_call", action="hang", hang_s=step_timeout_s + cfg.lease_ms / 1000 + 3)
                run_id = submit(f"hang-{pool}-{i}", QUERIES[i % len(QUERIES)])
                hit = faults.next_hit(30)
                if hit is None or hit[1] != run_id:
                    result.fail(run_id, "hang", "no step hung: the scenario did nothing")
                    continue
                hung_ms = time.time() * 1000
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


SCENARIOS = {"kill": kill, "zombie": zombie, "wipe": wipe, "db-restart": db_restart, "poison": poison,
             "rolling": rolling, "child-kill": child_kill, "redis-blip": redis_blip, "hang": hang}


def run(name: str, cfg: ChaosConfig, progress: Progress = print, **kwargs: int) -> ScenarioResult:
    """Run one scenario, timing it and counting fast-takeover false positives it caused."""
    client = get_redis()
    before = int(client.get(keys.FALSE_POSITIVES) or 0)
    started = time.monotonic()
    result = SCENARIOS[name](cfg, progress=progress, **kwargs)  # type: ignore[operator]
    result.elapsed_s = time.monotonic() - started
    result.false_positives = int(get_redis().get(keys.FALSE_POSITIVES) or 0) - before
    return result
