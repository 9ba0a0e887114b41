"""`fenced chaos`: run the chaos scenarios against the configured Redis and database, print the verdict."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from fenced.cli import app


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


@app.command()
def chaos(
    scenario: Annotated[list[Scenario], typer.Option("--scenario", "-s", help="Repeat for several; default all.")]
    = [Scenario.all],  # noqa: B006 - typer reads the default, never mutates it
    rounds: Annotated[int, typer.Option(min=1, help="Kill rounds (and zombie repetitions, capped at 10).")] = 30,
    runs: Annotated[int, typer.Option(min=1, help="Concurrent runs per kill round / per scenario.")] = 6,
    lease_ms: Annotated[int, typer.Option(min=200, help="Lease TTL of the chaos workers.")] = 30_000,
    step_ms: Annotated[int, typer.Option(min=0, help="Stub model latency per step.")] = 400,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Kill, freeze and wipe real workers and stores, then judge every run. Point it at a test deployment:
    `wipe` flushes the configured Redis and `db-restart` restarts the local MariaDB."""
    from chaos.harness import ChaosConfig
    from chaos.report import ScenarioResult, render
    from chaos.scenarios import SCENARIOS, run
    from checkpoints.db import migrate

    migrate()
    names = list(SCENARIOS) if Scenario.all in scenario else [s.value for s in scenario]
    cfg = ChaosConfig(lease_ms=lease_ms, step_ms=step_ms)
    results: list[ScenarioResult] = []
    err = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err, transient=as_json) as bar:
        for name in names:
            total = {"kill": rounds, "zombie": min(rounds, 10), "child-kill": min(rounds, 10),
                     "hang": 2 * (min(rounds, 5) + 1)}.get(name)
            task = bar.add_task(name, total=total)

            def progress(message: str, task_id: TaskID = task) -> None:
                bar.update(task_id, description=message, advance=1)

            kwargs = {"kill": {"rounds": rounds, "runs": runs}, "zombie": {"times": min(rounds, 10)},
                      "child-kill": {"times": min(rounds, 10)},
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
