"""Chaos on a Redis Cluster: the local cluster of scripts/redis-cluster.sh, pointing this process (and the
workers it starts, which inherit its environment) at it, and the `cluster-master-kill` scenario.

`use_local_cluster()` must run before anything reads the settings or builds the Celery app (`fenced chaos
--cluster` calls it first): fenced's Redis becomes `redis+cluster://…`; the broker stays on a plain Redis
(FENCED_BROKER_URL, or the plain FENCED_REDIS_URL configured before), since kombu has no Cluster transport.

cluster-master-kill: a worker stops itself (SIGSTOP) right before checkpoint A of a run; the cluster master
holding that run's lease is SIGKILLed with every run in flight; its replica is promoted after
cluster-node-timeout. The other worker takes the runs over and the frozen one is woken. Every run must
finish once (judge: nothing charged, carded or paid twice, no stale write landed), the promotion must
happen, the ledger must show the takeovers of the runs whose leases lived on the killed master, and the
frozen holder's checkpoint A after waking must be refused by the epoch (fence_rejected), every round.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from chaos.harness import (
    QUERIES,
    ChaosConfig,
    Cluster,
    clear_faults,
    control_charge,
    judge,
    owner_pid,
    resumed_at_ms,
    rows,
    wait_for,
    wait_terminal,
)
from chaos.report import ScenarioResult
from chaos.scenarios import SCENARIOS, Progress, _cluster
from checkpoints import ledger
from checkpoints.schema import TERMINAL_STATES
from fenced_core.settings import CLUSTER_SCHEME, get_settings
from fencing import faults, keys
from fencing.connection import RedisUnavailable, get_redis
from harness.workers import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "redis-cluster.sh"
DEFAULT_PORT = 7000
CLAIMS = ("claimed", "takeover")


def local_url(base_port: int = DEFAULT_PORT) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{base_port + i}" for i in range(3))


def start_local(base_port: int = DEFAULT_PORT) -> None:
    """Start the local cluster (or leave it running) and wait until cluster_state:ok."""
    done = subprocess.run(["bash", str(SCRIPT), "start", str(base_port)], capture_output=True, text=True,
                          timeout=120)
    if done.returncode:
        raise RuntimeError(f"scripts/redis-cluster.sh start {base_port} failed:\n{done.stdout}{done.stderr}")


def use_local_cluster(base_port: int = DEFAULT_PORT) -> dict[str, str]:
    """Start the local cluster and point this process's settings (and its future workers) at it. The broker
    stays where it was: FENCED_BROKER_URL, else the plain Redis FENCED_REDIS_URL named so far."""
    before = os.environ.get("FENCED_REDIS_URL", "redis://127.0.0.1:6379/0")
    broker = os.environ.get("FENCED_BROKER_URL") or before
    if broker.startswith(CLUSTER_SCHEME) or broker.startswith("redis+sentinel://"):
        raise RuntimeError("--cluster needs a plain Redis for the Celery broker (kombu has no Cluster transport): "
                           "set FENCED_BROKER_URL=redis://HOST:PORT/DB")
    start_local(base_port)
    env = {"FENCED_REDIS_URL": local_url(base_port), "FENCED_BROKER_URL": broker}
    os.environ.update(env)
    get_settings.cache_clear()
    from fencing import connection

    connection.reset()
    return env


def on_cluster() -> bool:
    return get_settings().redis_url.startswith(CLUSTER_SCHEME)


@dataclass(frozen=True)
class Failover:
    """One master kill: which node died, which replica took its slots, and how long that took."""

    killed: str  # host:port
    promoted: str | None
    kill_ms: float
    promoted_after_ms: float | None


class ClusterNodes:
    """The local cluster's redis-server processes (their pid files under /tmp, from redis-cluster.sh)."""

    def pid_file(self, port: int) -> Path | None:
        found = glob.glob(f"/tmp/fenced-redis-cluster-*/{port}/redis.pid")  # noqa: S108  (the script's data dirs)
        return Path(found[0]) if found else None

    def base_port(self, port: int) -> int | None:
        pid_file = self.pid_file(port)
        return int(pid_file.parent.parent.name.rsplit("-", 1)[1]) if pid_file else None

    def master_of(self, key: str) -> str:
        """host:port of the master serving `key` now."""
        return str(get_redis().get_node_from_key(key).name)  # type: ignore[attr-defined]

    def kill_master(self, name: str, timeout_s: float = 30) -> Failover:
        """SIGKILL master `name` and wait until one of its replicas serves its slots as a master."""
        import redis

        port = int(name.rsplit(":", 1)[1])
        pid_file = self.pid_file(port)
        if pid_file is None:
            raise RuntimeError(f"{name} is not a node of a local cluster started by scripts/redis-cluster.sh")
        replicas = self._replicas_of(port)
        kill_ms = time.time() * 1000
        os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for replica in replicas:
                try:
                    client = redis.Redis(host="127.0.0.1", port=replica, socket_timeout=1, decode_responses=True)
                    role = client.execute_command("ROLE")[0]
                    info = client.cluster("INFO")
                    ok = (info.get("cluster_state") if isinstance(info, dict) else "") == "ok"
                    client.close()
                except redis.RedisError:
                    continue
                if role == "master" and ok:
                    return Failover(name, f"127.0.0.1:{replica}", kill_ms, time.time() * 1000 - kill_ms)
            time.sleep(0.05)
        return Failover(name, None, kill_ms, None)

    def restart(self, name: str) -> None:
        """Start the killed node again: it rejoins (from its nodes.conf) as a replica of the promoted one."""
        base = self.base_port(int(name.rsplit(":", 1)[1]))
        if base is not None:
            start_local(base)

    def healthy(self) -> None:
        """Wait (through redis-cluster.sh start) until every node is up, the state ok and every master has a
        replica in sync; a no-op for a cluster this harness did not start."""
        client: Any = get_redis()
        base = next((b for n in client.get_nodes() if (b := self.base_port(n.port)) is not None), None)
        if base is not None:
            start_local(base)

    def _replicas_of(self, port: int) -> list[int]:
        import redis

        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, decode_responses=True)
        try:
            lines = str(client.execute_command("CLUSTER", "NODES")).splitlines()
        finally:
            client.close()
        me = next(line.split()[0] for line in lines if "myself" in line)
        return [int(line.split()[1].split("@")[0].rsplit(":", 1)[1]) for line in lines if line.split()[3] == me]


def cluster_master_kill(cfg: ChaosConfig, times: int = 1, runs: int = 8, progress: Progress = print) -> ScenarioResult:
    """`times` rounds of: freeze a holder before checkpoint A, SIGKILL the master of its run's lease with
    `runs` runs in flight, wait for the promotion, wake the frozen holder; see the module doc."""
    result = ScenarioResult("cluster-master-kill", {"times": times, "runs": runs, "lease_ms": cfg.lease_ms})
    nodes = ClusterNodes()
    if not on_cluster():
        result.notes.append("skipped: fenced's Redis is not a Redis Cluster (run `fenced chaos --cluster`)")
        return result
    # Steps long enough that the kill lands mid-step; enough slots that every run is in flight at once.
    slow = replace(cfg, step_ms=max(cfg.step_ms, 800), concurrency=max(cfg.concurrency, runs // 2 + 1))
    fenced_out = 0
    with _workers(slow) as (cluster, submit):
        cluster.start(2)
        control = control_charge(submit, slow.timeout_s)
        for i in range(times):
            nodes.healthy()  # every master with a synced replica, or a kill would lose its slots for good
            faults.arm("before_checkpoint_a", action="stop")
            ids = [submit(f"master-kill-{i}-{n}", QUERIES[n % len(QUERIES)]) for n in range(runs)]
            hit = faults.next_hit(60)  # armed once: it fires no more (disarmed at the end; disarming here could
            # land between the worker's hit and its read of the action, making the stop a hang)
            frozen = cluster.node_of(hit[2]) if hit else None
            if hit is None or frozen is None:
                result.fail(ids[0], "did_nothing", "no worker stopped before checkpoint A: nothing was frozen")
                judge(result, ids, control)
                continue
            stale_run = hit[1]
            time.sleep(0.2)  # the SIGSTOP it sent itself lands
            before = {r.run_id: r for r in rows(ids)}
            in_flight = [r for r, row in before.items() if row.state not in TERMINAL_STATES]
            victim = nodes.master_of(keys.lease(stale_run))
            on_victim = [r for r in in_flight if nodes.master_of(keys.lease(r)) == victim]
            failover = nodes.kill_master(victim)
            progress(f"cluster-master-kill {i + 1}/{times}: master {victim} killed with {len(in_flight)} runs in "
                     f"flight ({len(on_victim)} leases on it); promoted {failover.promoted or 'NONE'} after "
                     f"{failover.promoted_after_ms or 0:.0f} ms")
            if failover.promoted is None:
                result.fail(stale_run, "failover", f"no replica of {victim} was promoted within 30 s")
            else:
                result.latency("master kill -> replica promoted", failover.promoted_after_ms or 0)
            # This process's client learns the new slot map too (its first reads may still meet the dead
            # node, or a node that still says the cluster is down).
            wait_for(partial(_answers, keys.lease(stale_run)), 30, every_s=0.2)
            # Wake the frozen holder once another took its run over: its checkpoint A meets a newer epoch.
            resumed = wait_for(partial(_tolerant, partial(resumed_at_ms, stale_run, failover.kill_ms)),
                               slow.timeout_s)
            mine = {e.actor for e in ledger.history(stale_run)
                    if e.kind in CLAIMS and frozen.owns(owner_pid(e.actor) or -1)}
            still_stopped = _stopped(hit[2])
            frozen.kill(signal.SIGCONT)
            refused = wait_for(partial(_refusals, stale_run, mine), 15, every_s=0.2)
            nodes.restart(victim)
            if not wait_terminal(ids, slow.timeout_s):
                result.notes.append(f"round {i}: not every run ended within {slow.timeout_s:.0f} s")
            judge(result, ids, control)
            if resumed is None:
                result.fail(stale_run, "stream", "the frozen holder's run was never resumed by another worker")
            else:
                result.latency("master kill -> frozen holder's run resumed", resumed - failover.kill_ms)
            if not still_stopped:
                result.fail(stale_run, "zombie", "the frozen holder was running again before the harness woke it")
            # Woken, its next write is checkpoint A in the database, at the epoch the takeover superseded.
            if not refused:
                result.fail(stale_run, "zombie", "the frozen holder's checkpoint A after the failover was not refused")
            lost = _lost_with_failover(on_victim, failover.kill_ms)
            fenced_out += len(refused or []) + sum("refused" in how for how in lost.values())
            result.notes.append(
                f"round {i}: master {victim} killed, {failover.promoted} promoted after "
                f"{failover.promoted_after_ms or 0:.0f} ms; {len(on_victim)} of {len(in_flight)} runs in flight had "
                f"their lease on it; taken over after the kill (ledger): {len(lost)}"
                + "".join(f"\n  {run_id}: {how}" for run_id, how in lost.items())
                + f"\n  stale holder {sorted(mine)} of {stale_run}: "
                + ("refused (fence_rejected in the ledger)" if refused else "NOT refused"))
            if failover.promoted is not None and lost:
                result.acted += 1
        if result.acted and not fenced_out:
            result.fail(ids[0], "zombie", "no stale holder met the epoch in any round: the ledger shows no "
                                          "fence_rejected after a master kill")
        result.notes.append(f"stale writes refused by the epoch after the kills (fence_rejected): {fenced_out}")
    return result


@contextmanager
def _workers(cfg: ChaosConfig) -> Iterator[tuple[Cluster, Callable[[str, str], str]]]:
    """scenarios._cluster with its faults disarmed, where the workers are stopped even when disarming fails
    (the cluster may still be failing over: a raise there must not leave the workers running)."""
    with _cluster(cfg) as (cluster, submit):
        try:
            yield cluster, submit
        finally:
            try:
                clear_faults()
            except RedisUnavailable as exc:
                cluster.cfg.log_dir.joinpath("clear-faults.err").write_text(repr(exc))


def _answers(key: str) -> bool:
    """Does the cluster answer a read of `key` now?"""
    return _tolerant(lambda: get_redis().exists(key) is not None) or False


def _tolerant(read: Callable[[], Any]) -> Any:
    """`read()`, or None while the cluster is failing over (RedisUnavailable)."""
    try:
        return read()
    except RedisUnavailable:
        return None


def _refusals(run_id: str, tokens: set[str]) -> list[str]:
    """The fence rejections of holders `tokens` in the run's ledger."""
    return [e.actor for e in ledger.history(run_id) if e.kind == "fence_rejected" and e.actor in tokens]


def _stopped(pid: int) -> bool:
    """Is process `pid` stopped (SIGSTOP) now?"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def _lost_with_failover(run_ids: list[str], kill_ms: float) -> dict[str, str]:
    """Runs whose lease lived on the killed master and that another holder claimed after the kill: what the
    ledger says about each (the takeover's reason, and any fence rejection)."""
    out: dict[str, str] = {}
    for run_id in run_ids:
        after = [e for e in ledger.history(run_id) if e.at_ms >= kill_ms]
        takeovers = [e for e in after if e.kind == "takeover"]
        if takeovers:
            rejected = [e for e in after if e.kind == "fence_rejected"]
            out[run_id] = (f"takeover at epoch {takeovers[0].epoch}: {takeovers[0].reason}"
                           + (f"; {len(rejected)} stale write(s) refused" if rejected else ""))
    return out


SCENARIOS["cluster-master-kill"] = cluster_master_kill
