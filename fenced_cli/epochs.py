"""`fenced check-epochs`: are the database's epochs behind the Redis mirrors (a database that lost commits)?"""

from __future__ import annotations

from typing import Annotated

import typer

from fenced_cli.common import JsonOpt, _require_store, app, emit_json, fail


@app.command("check-epochs")
def check_epochs(
    limit: Annotated[int | None, typer.Option(
        "--runs", "-n", min=1, help="Check this many in-flight runs, most recently updated first "
                                    "(default FENCED_EPOCH_CHECK_RUNS, 10,000).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Compare in-flight runs' database epochs with their Redis epoch mirrors; exit 1 if any is behind
    (the database lost commits: see docs/operations.md, "After a database failover")."""
    from fenced_core.settings import get_settings
    from tasks.epoch_check import EpochsBehind, find_behind

    _require_store()
    n = limit if limit is not None else get_settings().epoch_check_runs or 10_000
    behind, checked = find_behind(n)
    if as_json:
        emit_json({"checked": checked, "behind": [vars(b) for b in behind]})
    elif behind:
        typer.echo(f"error: {EpochsBehind(behind, checked)}", err=True)
    else:
        typer.echo(f"ok: {checked} in-flight runs checked, no database epoch behind its Redis mirror")
    raise typer.Exit(1 if behind else 0)


@app.command("repair-epochs")
def repair_epochs(
    yes: Annotated[bool, typer.Option("--yes", help="Write: every worker and API replica is stopped.")] = False,
    limit: Annotated[int | None, typer.Option(
        "--runs", "-n", min=1, help="Check this many in-flight runs (default FENCED_EPOCH_CHECK_RUNS).")] = None,
    user: Annotated[str, typer.Option("--user", "-u", help="Who repairs (recorded in the ledger).")] = "cli",
) -> None:
    """After a database failover that lost commits: raise each in-flight run's epoch above its Redis
    mirror (ledger entry `epoch_repaired`), so no holder from before the failover can write. Stop every
    worker first; without --yes it only lists what it would change."""
    from fenced_core.settings import get_settings
    from tasks.epoch_check import find_behind, repair

    _require_store()
    n = limit if limit is not None else get_settings().epoch_check_runs or 10_000
    if not yes:
        behind, checked = find_behind(n)
        for b in behind:
            typer.echo(f"{b.run_id}: database epoch {b.db_epoch}, Redis mirror {b.mirror} "
                       f"-> would become {b.mirror + 1}")
        typer.echo(f"{len(behind)} of {checked} in-flight runs behind; stop every worker, then run again with --yes")
        raise typer.Exit(1 if behind else 0)
    for b, new in repair(user, n):
        typer.echo(f"{b.run_id}: epoch {b.db_epoch} -> {new} (Redis mirror was {b.mirror})")
    behind, checked = find_behind(n)
    if behind:
        fail(f"{len(behind)} of {checked} in-flight runs are still behind (they moved during the repair): run it again")
    typer.echo(f"ok: {checked} in-flight runs checked, none behind")
