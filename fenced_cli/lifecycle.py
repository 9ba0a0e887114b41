"""`fenced` commands for a run's lifecycle: reply, cancel, and the dead letters."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table

from fenced_cli.common import (
    JsonOpt,
    RunArg,
    _clock,
    app,
    emit_json,
    fail,
    out,
    refuse_if_epochs_behind,
    refused,
    resolve_run,
)

dlq = typer.Typer(help="Dead-lettered runs: list, show, replay.", no_args_is_help=True)
app.add_typer(dlq, name="dlq")
UserOpt = Annotated[str, typer.Option("--user", "-u", help="Who is acting (recorded in the ledger).")]
OwnerOpt = Annotated[str | None, typer.Option(
    "--user", "-u", help="The run's owner, acting: someone else's run is refused (exit 2, nothing written). "
                         "Omitted: an operator, recorded as 'cli'.")]


@app.command()
def reply(run_id: RunArg, text: Annotated[str, typer.Argument(help="The answer.")],
          user: OwnerOpt = None, as_json: JsonOpt = False) -> None:
    """Answer the question a waiting run asked; the run is queued and woken."""
    from fenced_core.errors import InvalidRequest, RunNotFound
    from tasks import service

    run = resolve_run(run_id)
    refuse_if_epochs_behind()
    try:
        answered = service.reply(run.run_id, text, user or "cli", user_id=user)
    except RunNotFound:  # the operator's lookup found it: it is another user's
        fail(f"run {run.run_id} belongs to another user; nothing was stored")
    except InvalidRequest as exc:
        fail(str(exc))
    if as_json:
        emit_json(asdict(answered))
    else:
        typer.echo(f"replied to {answered.kind} {answered.tool_call_id!r}: {answered.question}")


@app.command()
def cancel(run_id: RunArg, user: OwnerOpt = None, as_json: JsonOpt = False) -> None:
    """Cancel a run: it ends `cancelled`, what was used is settled, nothing of it lands afterwards."""
    from fenced_core.errors import InvalidRequest, RunNotFound
    from tasks import service

    run = resolve_run(run_id)
    refuse_if_epochs_behind()
    try:
        result = service.cancel(run.run_id, user or "cli", user_id=user)
    except RunNotFound:  # the operator's lookup found it: it is another user's
        fail(f"run {run.run_id} belongs to another user; nothing was cancelled")
    except InvalidRequest as exc:
        fail(str(exc))
    if as_json:
        emit_json(asdict(result))
    elif result.noop:
        typer.echo(f"run {run.run_id} is already {result.previous_state}: nothing to cancel")
    else:
        typer.echo(f"cancelled run {run.run_id} (was {result.previous_state}; charged {result.credits_charged})")


@dlq.command("list")
def dlq_list(as_json: JsonOpt = False, limit: Annotated[int, typer.Option(min=1)] = 50,
             include_revived: Annotated[bool, typer.Option("--all", help="Also runs replayed since.")] = False,
             ) -> None:
    """Runs that are dead now, newest first (`--all`: every dead letter, replayed ones too)."""
    from tasks import service

    found = service.dead_letters(limit, include_revived)
    if as_json:
        emit_json([asdict(d) for d in found])
        return
    table = Table("run", "step", "deliveries of step", "reason", "at (UTC)", "replays")
    for d in found:
        table.add_row(d.run_id, str(d.step), str(sum(a["step"] == d.step for a in d.attempts)), d.reason,
                      _clock(d.at_ms), str(d.replays))
    out.print(table if found else "no dead letters")


@dlq.command("show")
def dlq_show(run_id: RunArg, as_json: JsonOpt = False) -> None:
    """A dead letter: its reason, every attempt with its error, the last worker's observations."""
    from fenced_core.errors import InvalidRequest
    from tasks import service

    run = resolve_run(run_id)
    try:
        d = service.dead_letter(run.run_id)
    except InvalidRequest as exc:
        fail(str(exc))
    if as_json:
        emit_json(asdict(d))
        return
    of_step = [a for a in d.attempts if a["step"] == d.step]
    out.print(f"run {d.run_id}: dead at step {d.step}: {d.reason}  (replayed {d.replays} times)")
    out.print(f"deliveries of step {d.step}: {len(of_step)} (the last one dead-lettered it); "
              f"every delivery of the run: {len(d.attempts)}")
    table = Table("epoch", "step", "worker", "started (UTC)", "outcome", "error")
    for a in d.attempts:
        table.add_row(str(a["epoch"]), str(a["step"]), a["worker"], _clock(int(a["started_at_ms"])),
                      a["outcome"] or "no outcome: the worker died or was cut off", a["error"] or "")
    out.print(table)
    out.print(f"observations: {d.observations}")


@dlq.command("replay")
def dlq_replay(run_id: RunArg, user: UserOpt = "cli") -> None:
    """Replay a dead run from its last checkpoint with a fresh delivery budget."""
    from fenced_core.errors import AdmissionRefused, InvalidRequest
    from tasks import service

    run = resolve_run(run_id)
    refuse_if_epochs_behind()
    try:
        step = service.replay_dead_letter(run.run_id, user)
    except (InvalidRequest, AdmissionRefused) as exc:
        refused(exc)
    typer.echo(f"replaying run {run.run_id} from step {step}")
