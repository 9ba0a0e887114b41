"""`fenced demo`: a batch of runs, a worker SIGKILLed mid-step and restarted, and proof nothing doubled."""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from harness.embedded import Stores
from harness.verdict import CHECKS, RunVerdict, check_run
from harness.workers import READY_TEXT, WorkerProcess

# Short leases so a takeover happens in seconds; slow enough steps that the kill lands mid-step.
DEMO_DEFAULTS = {"FENCED_LEASE_TTL_MS": "3000", "FENCED_HEARTBEAT_MS": "1000", "FENCED_STUB_STEP_MS": "400"}
QUERIES: list[tuple[str, str]] = [
    ("buy wireless headphones for the office", "normal"),
    ("add the best running shoes to my cart", "normal"),
    ("which monitor is the best value?", "normal"),
    ("order a coffee grinder under $60", "normal"),
    ("buy a laptop for travel, compare them in depth", "large"),
    ("buy a desk lamp for reading", "normal"),
    ("compare office chair options", "normal"),
    ("buy a backpack that fits a laptop", "large"),
]
KILL_AFTER_S = 15.0  # give up waiting for the ideal moment and kill whoever holds a run
RESTART_AFTER_S = 2.0
FINISH_TIMEOUT_S = 120.0


@dataclass
class DemoResult:
    """The whole demo: per-run reports, the kill, the verdict (`ok` is the exit status)."""

    runs: list[RunVerdict]
    verdict: dict[str, bool]
    killed: dict[str, Any] | None
    stores: dict[str, str]
    elapsed_s: float
    worker_names: dict[int, str] = field(default_factory=dict)  # every incarnation's pid -> worker name

    def who(self, token: str | None) -> str:
        pid = owner_pid(token)
        return f"{self.worker_names.get(pid, '?') if pid else '?'}/{pid}"

    @property
    def ok(self) -> bool:
        return all(self.verdict.values())

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "verdict": self.verdict, "killed": self.killed, "stores": self.stores,
                "elapsed_s": self.elapsed_s, "runs": [r.to_dict() for r in self.runs]}


def quiet_core_logs(level: int = logging.WARNING) -> None:
    """Only warnings from the core's loggers in this process (the CLI is not a worker)."""
    for name in ("tasks", "fencing", "checkpoints", "fenced", "alembic"):
        logging.getLogger(name).setLevel(level)


def owner_pid(owner: str | None) -> int | None:
    """The pid in a lease token `host:pid:nonce/delivery`, or None."""
    if not owner:
        return None
    try:
        return int(owner.split("/", 1)[0].rsplit(":", 2)[1])
    except (IndexError, ValueError):
        return None


def run_demo(n_runs: int = 8, n_workers: int = 2, log: Console | None = None) -> DemoResult:
    """Run the demo end to end; stores, workers and the embedded Redis are cleaned up on any exit."""
    log = log or Console(stderr=True)
    started = time.monotonic()
    stores = Stores()
    workers: list[WorkerProcess] = []
    try:
        stores.start()
        stores.set_env({k: v for k, v in DEMO_DEFAULTS.items() if not os.environ.get(k)})
        log.print(f"[bold]stores[/] redis {stores.describe()['redis']}, db {stores.describe()['db']}")
        from checkpoints.db import migrate

        migrate()
        logs_dir = stores.state_dir / "logs"
        for i in range(1, n_workers + 1):
            path = logs_dir / f"w{i}.log"
            path.unlink(missing_ok=True)
            workers.append(WorkerProcess(f"w{i}", log_path=path, concurrency=4))
        for w in workers:
            w.start(wait_ready=False)
        for w in workers:
            w.wait_for_log(READY_TEXT, timeout=60)
        log.print(f"[bold]workers[/] {', '.join(f'{w.name} (pid {w.pid})' for w in workers)}; logs in {logs_dir}")

        from tasks import submit_run

        quiet_core_logs()  # the table tells the story; the workers' logs are in the files above

        run_ids = []
        n_users = max(3, -(-n_runs // 5))  # at most 5 runs each: far below max_runs_per_user
        session = os.urandom(3).hex()  # fresh users, fresh balances, on a store kept between demos
        for i in range(n_runs):
            query, kind = QUERIES[i % len(QUERIES)]
            run_ids.append(submit_run(f"demo-{session}-{i % n_users}", query, kind))
        log.print(f"[bold]submitted[/] {n_runs} runs")

        killed = _kill_mid_step(run_ids, workers, log)
        if killed:
            time.sleep(RESTART_AFTER_S)
            victim = next(w for w in workers if w.name == killed["worker"])
            victim.start(wait_ready=False)
            killed["restarted_pid"] = victim.pid
            log.print(f"[bold]restarted[/] {victim.name} as pid {victim.pid}")

        _wait_terminal(run_ids, FINISH_TIMEOUT_S, log)
        reports = [check_run(run_id) for run_id in run_ids]
        return DemoResult(reports, _verdict(reports), killed, stores.describe(),
                          round(time.monotonic() - started, 1), {pid: w.name for w in workers for pid in w.pids})
    finally:
        for w in workers:  # all at once: each finishes its current step while the others do too
            w.kill(signal.SIGTERM)
        for w in workers:
            try:
                w.stop(timeout=10)
            except Exception as exc:  # keep stopping the rest, and Redis
                log.print(f"[yellow]could not stop {w.name}: {exc!r}[/]")
        stores.stop()


def _live_rows(run_ids: list[str]) -> list[Any]:
    from checkpoints.db import transaction
    from checkpoints.schema import run_checkpoints as rc

    with transaction(readonly=True) as conn:
        return list(conn.execute(sa.select(rc.c.run_id, rc.c.state, rc.c.owner, rc.c.step, rc.c.phase)
                                 .where(rc.c.run_id.in_(run_ids))).all())


def _kill_mid_step(run_ids: list[str], workers: list[WorkerProcess], log: Console) -> dict[str, Any] | None:
    """SIGKILL the worker group holding the most runs mid-step, once some run got past its first step."""
    by_pid = {w.pid: w for w in workers if w.pid is not None}
    deadline = time.monotonic() + KILL_AFTER_S
    while True:
        rows = _live_rows(run_ids)
        if all(r.state not in ("queued", "running") for r in rows):
            log.print("[yellow]every run finished before a worker could be killed mid-step[/]")
            return None
        held: dict[int, list[Any]] = {}
        for r in rows:
            pid = owner_pid(r.owner)
            if r.state == "running" and pid is not None and pid in by_pid:
                held.setdefault(pid, []).append(r)
        if held:
            pid, mine = max(held.items(), key=lambda kv: len(kv[1]))
            # Ideal: several runs in flight there, one already past step 0 (so a resume is visible).
            ideal = len(mine) >= 2 and any(r.step >= 1 for r in mine)
            if ideal or time.monotonic() > deadline:
                victim = by_pid[pid]
                victim.kill(signal.SIGKILL)
                in_flight = [{"run_id": r.run_id, "step": r.step, "phase": r.phase} for r in mine]
                log.print(f"[bold red]SIGKILL[/] {victim.name} (pid {pid}) with {len(mine)} runs mid-step: "
                          + ", ".join(f"{r.run_id[:8]}@{r.step}/{r.phase}" for r in mine))
                return {"worker": victim.name, "pid": pid, "in_flight": in_flight}
        time.sleep(0.05)


def _wait_terminal(run_ids: list[str], timeout: float, log: Console) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = _live_rows(run_ids)
        if all(r.state not in ("queued", "running") for r in rows):
            return
        time.sleep(0.2)
    log.print(f"[bold red]timeout[/]: not every run was terminal after {timeout:.0f} s")


def _verdict(reports: list[RunVerdict]) -> dict[str, bool]:
    return {check: all(check not in r.failed for r in reports) for check in CHECKS}


def render(result: DemoResult, out: Console | None = None) -> None:
    """The table and the verdict lines (on stdout by default)."""
    out = out or Console(highlight=False)
    if not out.is_terminal and out.width < 150:
        out = Console(file=out.file, width=150, highlight=False)  # piped: don't squeeze into 80 columns
    table = Table(title="fenced demo", title_style="bold")
    for col, just in (("run", "left"), ("query", "left"), ("kind", "left"), ("state", "left"), ("steps", "right"),
                      ("credits", "right"), ("cards", "right"), ("takeovers survived", "left"),
                      ("resumed", "right"), ("finished on", "left")):
        table.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    table.columns[1].max_width = 34
    table.columns[1].overflow = "ellipsis"
    for r in result.runs:
        bad = not r.ok
        took_over_from = [result.who(t) for t in r.took_over_from]
        takeovers = str(r.takeovers) + (f" from {', '.join(took_over_from)} †" if took_over_from else "")
        table.add_row(
            r.run_id[:8], r.query, r.kind,
            f"[{'red' if r.state != 'done' else 'green'}]{r.state}[/]", str(r.steps),
            "-" if r.credits_charged is None else str(r.credits_charged), str(r.cards), takeovers,
            str(r.resumed_events), result.who(r.finished_by) if r.finished_by else "-", style="red" if bad else None,
        )
    out.print(table)
    n = len(result.runs)
    carted = sum(r.cards_expected > 0 for r in result.runs)
    lines = {**CHECKS, "done": f"all {n} runs done with an answer",
             "cards": f"one cart card where the agent added to cart ({carted}), none elsewhere ({n - carted})"}
    for key, ok in result.verdict.items():
        out.print(f"[{'green' if ok else 'red'}]{'✔' if ok else '✘'} {lines[key]}[/]")
    if result.killed:
        k = result.killed
        survived = sum(r.takeovers > 0 or r.rescues > 0 for r in result.runs)
        resumed = sum(r.resumed_events for r in result.runs)
        out.print(f"killed {k['worker']} (pid {k['pid']}) with {len(k['in_flight'])} runs mid-step, restarted as "
                  f"pid {k.get('restarted_pid')}; {survived} runs taken over or rescued, {resumed} task_resumed "
                  f"events; {result.elapsed_s:.1f} s")
    out.print(f"[bold {'green' if result.ok else 'red'}]verdict: {'PASS' if result.ok else 'FAIL'}[/]")
