"""What every `fenced` command shares: the Typer app, output that prints data literally, run lookup, errors."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

if TYPE_CHECKING:
    from checkpoints.runs import Run

app = typer.Typer(name="fenced", help="Durable, fenced, resumable agent runs on Celery.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_show_locals=False)


class _Out:
    """stdout for tables: looked up at each use (CliRunner swaps it); wide when piped, not 80 columns.

    Markup is off: every cell is data from users and models (a reason "[terminal]", a user "[/x]")
    and is printed literally, never interpreted."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        console = Console(highlight=False, markup=False)
        if not console.is_terminal:
            console = Console(highlight=False, markup=False, width=max(console.width, 160))
        console.print(*objects, **kwargs)


out = _Out()
CLI_DB_RETRY_S = 5.0
RUN_STATES = ("queued", "running", "waiting", "done", "failed", "cancelled", "dead")  # checkpoints.schema
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
RunArg = Annotated[str, typer.Argument(help="A run id (or a unique prefix of one, 4+ characters).")]


class Kind(StrEnum):
    normal = "normal"
    large = "large"


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `error: message` on stderr and exit (2 = bad input, nothing written)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def emit_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def _ms(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]


def _require_store() -> None:
    """Refuse to read a SQLite store that does not exist (SQLite would create an empty file)."""
    from fenced_core.settings import get_settings

    url = get_settings().db_url
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        path = Path(url.removeprefix("sqlite:///"))
        if not path.exists():
            fail(f"no run store at {path} (set FENCED_DB_URL, or run `fenced migrate` to create one)")


def resolve_run(run_id: str) -> Run:
    """The run with this id, or the only run whose id starts with it; exits 2 when there is none."""
    import sqlalchemy as sa

    from checkpoints import runs
    from checkpoints.db import transaction
    from checkpoints.schema import run_checkpoints as rc

    _require_store()
    run = runs.get_run(run_id)
    if run is not None:
        return run
    if re.fullmatch(r"[0-9a-fA-F-]{4,63}", run_id):
        with transaction(readonly=True) as conn:
            query = sa.select(rc.c.run_id).where(rc.c.run_id.startswith(run_id.lower())).limit(2)
            ids = conn.execute(query).scalars().all()
        if len(ids) == 1:
            found = runs.get_run(ids[0])
            if found is not None:
                return found
        if len(ids) > 1:
            fail(f"run id prefix {run_id!r} is ambiguous")
    fail(f"no run with id {run_id!r}")


def run_dict(run: Run) -> dict[str, Any]:
    """A run row without its checkpoint blob (steps = finished steps in the checkpoint)."""
    data = {k: v for k, v in vars(run).items() if k != "checkpoint"}
    data["steps_done"] = len(run.checkpoint.get("history", []))
    return data


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"fenced {version('fenced')}")
        raise typer.Exit(0)


@app.callback()
def _root(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the core's info logs.")] = False,
          _v: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                           help="Print the version and exit.")] = False) -> None:
    from examples.shopping.settings import get_shopping_settings
    from fenced_core.errors import ConfigError
    from fenced_core.settings import get_settings
    from harness.demo import quiet_core_logs

    try:
        get_settings()  # a bad FENCED_* variable is one clear line here, before any command runs
        get_shopping_settings()  # the demo's own (FENCED_MODEL, FENCED_STUB_*, ...): demo, cards, confirm
    except ConfigError as exc:
        fail(str(exc))

    if not verbose:
        quiet_core_logs()
        logging.getLogger("checkpoints.db").addFilter(_RetryNotice())


class _RetryNotice(logging.Filter):
    """At a prompt, a database outage shows as one line when retrying starts, not a log line per try."""

    shown = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "db_retry" not in record.getMessage():
            return True
        if not _RetryNotice.shown:
            _RetryNotice.shown = True
            from checkpoints.db import retry_window_s

            typer.echo(f"waiting for the run store (retrying for up to {retry_window_s():g} s)…", err=True)
        return False
