"""`fenced chaos`: run the chaos scenarios against the configured Redis and database, print the verdict."""

from __future__ import annotations

import importlib.util
import json
import sys
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from fenced_cli.common import app, fail

if TYPE_CHECKING:
    from chaos.harness import ChaosConfig


class ChaosPool(StrEnum):
    threads = "threads"
    gevent = "gevent"


class Scenario(StrEnum):
    all = "all"
    kill = "kill"
    zombie = "zombie"
    wipe = "wipe"
    db_restart = "db-restart"
    poison = "poison"
    rolling = "rolling"
    child_kill = "child-kill"
    redis_blip = "redis-blip"
    hang = "hang"
    redis_failover = "redis-failover"
    cluster_master_kill = "cluster-master-kill"


@app.command()
def chaos(
    scenario: Annotated[list[Scenario], typer.Option("--scenario", "-s", help="Repeat for several; default all.")]
    = [Scenario.all],  # noqa: B006 - typer reads the default, never mutates it
    rounds: Annotated[int, typer.Option(min=1, help="Kill rounds (and zombie repetitions, capped at 10).")] = 30,
    runs: Annotated[int, typer.Option(min=1, help="Concurrent runs per kill round / per scenario.")] = 6,
    lease_ms: Annotated[int, typer.Option(min=200, help="Lease TTL of the chaos workers.")] = 30_000,
    step_ms: Annotated[int, typer.Option(min=0, help="Stub model latency per step.")] = 400,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    mutations: Annotated[bool, typer.Option("--mutations", help="Run the mutation matrix instead: every "
                                            "mutation of chaos/mutation.py against its scenario, with a control "
                                            "run from the unmutated tree; exit 1 if one is not caught.")] = False,
    mutation: Annotated[list[str], typer.Option("--mutation", "-m", help="With --mutations: only these "
                                                "(repeat for several).")] = [],  # noqa: B006
    app_module: Annotated[str | None, typer.Option("--app", help="Run the scenarios on your own agent: the module "
                                                   "that defines it (importable here and by the workers, which "
                                                   "import it besides FENCED_IMPORTS).")] = None,
    agent: Annotated[str | None, typer.Option("--agent", help="With --app: the agent to submit runs to, when the "
                                              "module registers more than one.")] = None,
    sentinel: Annotated[bool, typer.Option("--sentinel", help="Run through Redis Sentinel: start the local "
                                           "deployment (scripts/redis-sentinel.sh) if needed and point fenced's Redis "
                                           "and the broker at it; redis-failover runs only in this mode.")] = False,
    cluster: Annotated[bool, typer.Option("--cluster", help="Run on a local Redis Cluster: start it "
                                          "(scripts/redis-cluster.sh, ports --cluster-port..+5) if needed and point "
                                          "fenced's Redis at it; the broker stays on FENCED_BROKER_URL or the plain "
                                          "Redis configured (kombu has no Cluster transport); cluster-master-kill "
                                          "runs only in this mode.")] = False,
    cluster_port: Annotated[int, typer.Option(min=1, max=65530, help="With --cluster: the first of the six "
                                              "nodes' ports.")] = 7000,
    pool: Annotated[ChaosPool, typer.Option("--pool", help="The workers' Celery pool (gevent needs the gevent "
                                            "extra); the scenarios about prefork children keep prefork.")]
    = ChaosPool.threads,
) -> None:
    """Kill, freeze and wipe real workers and stores, then judge every run. Point it at a test deployment:
    `wipe` flushes the configured Redis and `db-restart` restarts the local MariaDB."""
    if sentinel and cluster:
        fail("--sentinel and --cluster are two different Redis deployments: choose one")
    if sentinel:
        _use_sentinel()
    if cluster:
        _use_cluster(cluster_port)
    from chaos.harness import ChaosConfig
    from chaos.report import ScenarioResult, render
    from chaos.scenarios import SCENARIOS, run
    from checkpoints.db import migrate

    migrate()
    chosen = _user_agent(app_module, agent) if app_module else None
    if chosen and (mutations or mutation):
        fail("--mutations runs the demo agent's mutation matrix; it cannot be combined with --app")
    if mutations or mutation:
        _mutations(mutation, ChaosConfig(lease_ms=min(lease_ms, 2000), step_ms=min(step_ms, 300), tool_ms=200),
                   as_json)
        return
    names = list(SCENARIOS) if Scenario.all in scenario else [s.value for s in scenario]
    if not sentinel and SENTINEL_ONLY in names:
        if Scenario.all not in scenario:
            fail(f"{SENTINEL_ONLY} kills the Sentinel-managed primary: run it with --sentinel")
        names.remove(SENTINEL_ONLY)
    if not cluster and CLUSTER_ONLY in names:
        if Scenario.all not in scenario:
            fail(f"{CLUSTER_ONLY} kills a Redis Cluster master: run it with --cluster")
        names.remove(CLUSTER_ONLY)
    if chosen:
        demo_only = [n for n in names if n in DEMO_ONLY]
        if Scenario.all not in scenario and demo_only:
            fail(f"scenario(s) {', '.join(demo_only)} drive the demo agent's test markers; with --app run "
                 f"{', '.join(n for n in SCENARIOS if n not in DEMO_ONLY)}")
        names = [n for n in names if n not in DEMO_ONLY]
    if pool is ChaosPool.gevent and importlib.util.find_spec("gevent") is None:
        fail("--pool gevent: gevent is not installed (pip install 'fenced[gevent]')")
    cfg = ChaosConfig(lease_ms=lease_ms, step_ms=step_ms, app=app_module or "", agent=chosen or "", pool=pool.value)
    if sentinel:  # worker logs apart from a plain run's (.fenced/chaos-sentinel/w1.log, …)
        cfg.log_dir = cfg.log_dir.with_name("chaos-sentinel")
    results: list[ScenarioResult] = []
    err = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err, transient=as_json) as bar:
        for name in names:
            total = {"kill": rounds, "zombie": min(rounds, 10), "child-kill": min(rounds, 10),
                     "redis-failover": min(rounds, 10), "cluster-master-kill": min(rounds, 5),
                     "hang": 2 * (min(rounds, 5) + 1)}.get(name)
            task = bar.add_task(name, total=total)

            def progress(message: str, task_id: TaskID = task) -> None:
                bar.update(task_id, description=message, advance=1)

            kwargs = {"kill": {"rounds": rounds, "runs": runs}, "zombie": {"times": min(rounds, 10)},
                      "child-kill": {"times": min(rounds, 10)},
                      "redis-failover": {"times": min(rounds, 10), "runs": runs},
                      "cluster-master-kill": {"times": min(rounds, 5), "runs": runs},
                      "hang": {"times": min(rounds, 5)}}.get(name, {"runs": runs})
            result = run(name, cfg, progress=progress, **kwargs)
            results.append(result)
            bar.update(task, description=f"{name}: {'PASS' if result.ok else 'FAIL'}", completed=total or 1,
                       total=total or 1)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        render(results)
    raise typer.Exit(0 if all(r.ok or not r.runs for r in results) else 1)


def _use_cluster(base_port: int) -> None:
    """Point this process and its workers at the local Redis Cluster before anything reads the settings."""
    from chaos.redis_cluster import use_local_cluster

    try:
        env = use_local_cluster(base_port)
    except RuntimeError as exc:
        fail(str(exc))
    Console(stderr=True).print(f"[dim]on a Redis Cluster: {env['FENCED_REDIS_URL']} (broker "
                               f"{env['FENCED_BROKER_URL']})[/]")


CLUSTER_ONLY = "cluster-master-kill"  # kills a master of the local Redis Cluster (--cluster)


def _use_sentinel() -> None:
    """Point this process and its workers at the local Sentinel deployment before anything reads the settings."""
    from chaos.sentinel import use_local_sentinel

    try:
        env = use_local_sentinel()
    except RuntimeError as exc:
        fail(str(exc))
    Console(stderr=True).print(f"[dim]through Sentinel: {env['FENCED_REDIS_URL']} (broker {env['FENCED_BROKER_URL']}, "
                               f"master {env['FENCED_BROKER_MASTER_NAME']})[/]")


SENTINEL_ONLY = "redis-failover"  # needs fenced's Redis and the broker behind Sentinel (--sentinel)

# Scenarios that need the demo stub's test markers ([poison] kills its own worker): not for a user's agent.
DEMO_ONLY = ("poison",)


def _user_agent(module: str, agent: str | None) -> str:
    """Import the user's module and choose the agent the scenarios submit to: the one named, or the only
    one the module registers. Submits in this process (and the workers) then go to it."""
    import importlib
    import os

    from fenced_core.settings import get_settings
    from tasks import programs

    before = set(programs.names())
    try:
        importlib.import_module(module)
    except ImportError as exc:
        fail(f"--app {module}: cannot import it here ({exc}); run from where it is importable")
    added = sorted(set(programs.names()) - before) or programs.names()
    if agent is None:
        if len(added) != 1:
            fail(f"--app {module} registers {added or 'no agent'}; name the one to run with --agent")
        agent = added[0]
    elif programs.lookup(agent) is None:
        fail(f"--agent {agent}: not registered by {module} (registered: {', '.join(programs.names()) or 'none'})")
    os.environ["FENCED_DEFAULT_AGENT"] = agent
    get_settings.cache_clear()
    return agent


def _mutations(names: list[str], cfg: ChaosConfig, as_json: bool) -> None:
    """Run the mutation matrix (or the named mutations) and print its table."""
    from rich.table import Table

    from chaos.mutation import MUTATIONS, MutationResult, check_mutation

    unknown = [n for n in names if n not in MUTATIONS]
    if unknown:
        raise typer.BadParameter(f"unknown mutation(s) {unknown}; known: {', '.join(MUTATIONS)}")
    err = Console(stderr=True)
    results: list[MutationResult] = []
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                  transient=True) as bar:
        task = bar.add_task("mutations")
        for name in names or list(MUTATIONS):
            results.append(check_mutation(name, cfg, progress=lambda msg: bar.update(task, description=msg)))
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        out = Console(width=None if sys.stdout.isatty() else 200)
        table = Table(title=f"fenced mutation matrix (lease {cfg.lease_ms} ms unless the mutation sets one)")
        for col in ("mutation", "scenario", "must fail on", "control ok", "mutant failed on", "caught", "time"):
            table.add_column(col)
        for r in results:
            if r.equivalent:
                caught = "[yellow]no: equivalent[/]" if r.mutant.ok else "[red]yes, though listed as equivalent[/]"
            else:
                caught = ("[green]yes[/]" if r.caught else "[red]no (blocked: see below)[/]" if r.blocked
                          else "[red]no[/]")
            table.add_row(r.name, r.scenario, ", ".join(r.expected), "yes" if r.control_ok else "[red]NO[/]",
                          ", ".join(r.mutant_failed) or "-", caught,
                          f"{r.control.elapsed_s + r.mutant.elapsed_s:.0f} s")
        out.print(table)
        for r in results:
            if r.equivalent:
                out.print(f"[dim]{r.name}: equivalent mutant: {r.equivalent}[/]")
            if r.blocked and not r.caught:
                out.print(f"[red]{r.name}: blocked: {r.blocked}[/]")
            for label, res in (("control", r.control), ("mutant", r.mutant)):
                if res is r.mutant and r.caught:
                    continue
                for f in res.failures[:5]:
                    out.print(f"[red]{r.name} ({label}): run {f.run_id} broke '{f.condition}': {f.reason}[/]")
                for note in res.notes:
                    out.print(f"[dim]{r.name} ({label}): {note}[/]")
    raise typer.Exit(0 if all(r.ok for r in results) else 1)
