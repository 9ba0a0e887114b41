"""The chaos harness: a cluster of worker nodes on the configured stores, and the run-judging helpers."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pytest_celery import CeleryTestSetup

from chaos.nodes import WorkerNode, local_setup
from chaos.report import ScenarioResult
from checkpoints import billing, runs
from checkpoints.db import transaction
from checkpoints.schema import TERMINAL_STATES, run_checkpoints
from fencing import keys
from fencing.connection import get_redis
from harness.history import check_healthy, check_history
from harness.verdict import check_run
from harness.workers import REPO_ROOT

QUERIES = ("buy headphones", "buy running shoes", "buy a backpack", "buy a desk lamp", "buy a keyboard",
           "buy a blender", "buy an umbrella", "buy a monitor")


@dataclass
class ChaosConfig:
    """Knobs of a chaos run; the worker env derives from them."""

    lease_ms: int = 2_000
    step_ms: int = 400
    tool_ms: int = 300
    concurrency: int = 4
    log_dir: Path = field(default_factory=lambda: REPO_ROOT / ".fenced" / "chaos")
    cwd: Path = REPO_ROOT  # the mutation check runs workers from a patched copy
    finish_timeout_s: float = 0.0  # 0: derived from the lease
    app: str = ""  # a user's module the workers import besides FENCED_IMPORTS (`fenced chaos --app`)
    agent: str = ""  # the agent the scenarios' runs are submitted to ("" = FENCED_DEFAULT_AGENT)
    pool: str = "threads"  # the workers' pool (`fenced chaos --pool`); the prefork scenarios keep prefork
    inline_steps: int | None = None  # FENCED_INLINE_STEPS of the workers (None: the default)

    def worker_env(self, **overrides: str) -> dict[str, str]:
        heartbeat = max(100, self.lease_ms // 4)
        env = {
            "FENCED_LEASE_TTL_MS": str(self.lease_ms),
            "FENCED_HEARTBEAT_MS": str(heartbeat),
            "FENCED_REAPER_TICK_MS": str(min(1000, max(100, self.lease_ms // 8))),
            "FENCED_SWEEPER_INTERVAL_MS": "1000",
            "FENCED_SWEEPER_GRACE_MS": str(max(4000, 2 * self.lease_ms)),
            "FENCED_STUB_STEP_MS": str(self.step_ms),
            "FENCED_STUB_TOOL_MS": str(self.tool_ms),
            "FENCED_RETRY_BASE_MS": "50",
            "FENCED_FAULTS_ENABLED": "1",
            "FENCED_STUB_COUNT_PAID": "1",
        }
        if self.app:
            from fenced_core.settings import get_settings

            env["FENCED_IMPORTS"] = ",".join(m for m in (get_settings().imports, self.app) if m)
        if self.agent:
            env["FENCED_DEFAULT_AGENT"] = self.agent
        if self.inline_steps is not None:
            env["FENCED_INLINE_STEPS"] = str(self.inline_steps)
        return {**os.environ, **env, **overrides}

    @property
    def timeout_s(self) -> float:
        return self.finish_timeout_s or 3 * self.lease_ms / 1000 + 60


class Cluster:
    """Worker nodes started for one scenario; `close()` stops whatever is left."""

    def __init__(self, cfg: ChaosConfig) -> None:
        self.cfg = cfg
        self.nodes: list[WorkerNode] = []
        cfg.log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, n: int, pool: str | None = None, prefix: str = "w", **env: str) -> list[WorkerNode]:
        """`n` worker nodes on `pool` (default: the config's)."""
        nodes = [WorkerNode(f"{prefix}{len(self.nodes) + i + 1}", self.cfg.worker_env(**env), self.cfg.log_dir,
                            pool=pool or self.cfg.pool, concurrency=self.cfg.concurrency) for i in range(n)]
        for node in nodes:
            node.process.cwd = self.cfg.cwd
            node.start()
        self.nodes.extend(nodes)
        return nodes

    def setup(self) -> CeleryTestSetup:
        """These worker nodes and the broker as pytest-celery's CeleryTestSetup (chaos.nodes.local_setup)."""
        from fenced_core.settings import get_settings
        from tasks.celery_app import app

        return local_setup(self.nodes, get_settings().effective_broker_url, app)

    def node_of(self, pid: int) -> WorkerNode | None:
        return next((n for n in self.nodes if n.owns(pid)), None)

    def close(self) -> None:
        for node in self.nodes:
            if node.alive:
                node.kill(signal.SIGCONT)
                node.stop()


def owner_pid(owner: str | None) -> int | None:
    """The pid in a lease token `host:pid:nonce/delivery`."""
    if not owner:
        return None
    try:
        return int(owner.split("/", 1)[0].split(":")[1])
    except (IndexError, ValueError):
        return None


def rows(run_ids: list[str]) -> list[Any]:
    """state, owner and step of each run (tolerates a database that is restarting)."""
    try:
        with transaction(readonly=True) as conn:
            return list(conn.execute(sa.select(run_checkpoints.c.run_id, run_checkpoints.c.state,
                                               run_checkpoints.c.owner, run_checkpoints.c.step)
                                     .where(run_checkpoints.c.run_id.in_(run_ids))).all())
    except sa.exc.OperationalError:
        return []


def wait_for(pred: Callable[[], Any], timeout_s: float, every_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every_s)
    return None


def wait_terminal(run_ids: list[str], timeout_s: float) -> bool:
    def done() -> bool:
        found = rows(run_ids)
        return len(found) == len(run_ids) and all(r.state in TERMINAL_STATES for r in found)

    return bool(wait_for(done, timeout_s, every_s=0.2))


def last_events(run_ids: list[str]) -> dict[str, tuple[str, int]]:
    """Each run's newest event: (type, stream-id milliseconds)."""
    client = get_redis()
    pipe = client.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.xrevrange(keys.events(run_id), count=1)
    out = {}
    for run_id, entries in zip(run_ids, pipe.execute(), strict=True):
        if entries:
            stream_id, fields = entries[0]
            out[run_id] = (fields["type"], int(stream_id.split("-")[0]))
    return out


def resumed_at_ms(run_id: str, after_ms: float) -> int | None:
    """When the first task_resumed after `after_ms` was appended (Redis clock, same machine)."""
    entries: list[tuple[str, dict[str, str]]] = get_redis().xrange(  # type: ignore[assignment]
        keys.events(run_id), min=f"{int(after_ms)}-0")
    for stream_id, fields in entries:
        if fields["type"] == "task_resumed":
            return int(stream_id.split("-")[0])
    return None


def watch_state(run_id: str) -> str:
    """What watches a run in Redis right now, for a takeover that comes late: its lease (value, ms
    left), its rescue marker (holder, ms left) and its entries in the reaper's index (due in ms)."""
    client = get_redis()
    now = time.time() * 1000
    pipe = client.pipeline(transaction=False)
    pipe.get(keys.lease(run_id))
    pipe.pttl(keys.lease(run_id))
    pipe.get(keys.rescue(run_id))
    pipe.pttl(keys.rescue(run_id))
    pipe.zrange(keys.lease_index(run_id), 0, -1, withscores=True)
    lease, lease_ms, marker, marker_ms, index = pipe.execute()
    entries = [f"{member} due in {score - now:.0f} ms" for member, score in index
               if keys.index_run_id(member) == run_id]
    return (f"lease {lease!r} ({lease_ms} ms left), rescue marker {marker!r} ({marker_ms} ms left), "
            f"index entries: {', '.join(entries) or 'none'}")


def control_charge(submit: Callable[[str, str], str], timeout_s: float) -> int | None:
    """Credits an unkilled run of the standard query costs (the chaos verdict compares against it)."""
    run_id = submit("chaos-control", QUERIES[0])
    if not wait_terminal([run_id], timeout_s):
        return None
    return check_run(run_id).credits_charged


def judge(result: ScenarioResult, run_ids: list[str], control: int | None, *, check_events: bool = True,
          expect: str = "done", healthy: bool = False, gap_ms: int = 1000) -> None:
    """Judge every run against the four conditions (and the control run's charge). `healthy`: these runs
    were not disturbed, so they must also meet harness.history.HEALTHY_CONDITIONS (no takeover or rescue,
    every step handed to the next within `gap_ms`)."""
    from examples.shopping.settings import get_shopping_settings

    one_call = billing.credits_for(get_shopping_settings().stub_tokens, 0, 10**9)
    result.runs += len(run_ids)
    # The history, not only the final rows: stale writes, stream order, paid calls, accounts, orders.
    for violation in check_history(run_ids):
        result.fail(violation.where, violation.condition, violation.detail)
    for violation in check_healthy(run_ids, gap_ms) if healthy else []:
        result.fail(violation.where, violation.condition, violation.detail)
    for run_id in run_ids:
        v = check_run(run_id, check_events=check_events)
        if expect != "done":
            if v.state != expect:
                result.fail(run_id, "state", f"{v.state}, expected {expect}")
            continue
        for condition, reason in v.failed.items():
            result.fail(run_id, condition, reason)
        if control is not None and v.credits_charged is not None and abs(v.credits_charged - control) > one_call:
            result.fail(run_id, "charged_once", f"charged {v.credits_charged}, control run {control}")


def clear_faults() -> None:
    get_redis().delete(keys.FAULTS, keys.FAULT_HITS)


def state(run_id: str) -> str | None:
    run = runs.get_run(run_id)
    return run.state if run else None
