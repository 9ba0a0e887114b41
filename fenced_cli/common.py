"""What every `fenced` command shares: the Typer app, output that prints data literally, run lookup, errors."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

if TYPE_CHECKING:
    from tasks.service import RunSummary, RunView

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


def refused(exc: Exception) -> NoReturn:
    """Exit on a refused request: 1 when it was refused because a store could not be reached (admission
    "unavailable": retry later, as for any outage), else 2 (bad input or a limit). Nothing was written."""
    from fenced_core.errors import AdmissionRefused

    fail(str(exc), 1 if isinstance(exc, AdmissionRefused) and exc.limit == "unavailable" else 2)


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


def refuse_if_epochs_behind() -> None:
    """Before a command that writes: exit 1 when the database's epochs are behind the Redis mirrors (it
    lost commits; tasks.epoch_check). FENCED_EPOCH_CHECK_RUNS=0 skips it."""
    from tasks.epoch_check import EpochsBehind, ensure_epochs_not_behind

    try:
        ensure_epochs_not_behind()
    except EpochsBehind as exc:
        fail(f"refusing to write: {exc}", code=1)


def resolve_run(run_id: str) -> RunView:
    """The run with this id, or the only run whose id starts with it (tasks.service.resolve_id), as an
    operator sees it; exits 2 when there is none."""
    from fenced_core.errors import InvalidRequest, RunNotFound
    from tasks import service

    _require_store()
    try:
        return service.get_run(service.resolve_id(run_id))
    except (RunNotFound, InvalidRequest) as exc:
        fail(str(exc))


def run_dict(run: RunSummary) -> dict[str, Any]:
    """A run as `--json` prints it: the row without its checkpoint blob (steps_done = finished steps)."""
    return {k: v for k, v in run.to_dict().items() if k != "question"}


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"fenced {version('fenced')}")
        raise typer.Exit(0)


@app.callback()
def _root(ctx: typer.Context,
          verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the core's info logs.")] = False,
          _v: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                           help="Print the version and exit.")] = False) -> None:
    from examples.shopping.settings import get_shopping_settings
    from fenced_core.errors import ConfigError
    from fenced_core.settings import get_settings, warn_unknown_names
    from harness.demo import quiet_core_logs

    try:
        get_settings()  # a bad FENCED_* variable is one clear line here, before any command runs
        get_shopping_settings()  # the demo's own (FENCED_MODEL, FENCED_STUB_*, ...): demo, cards, confirm
    except ConfigError as exc:
        fail(str(exc))
    if ctx.invoked_subcommand not in ("worker", "flower"):  # those exec celery, whose celeryconfig warns
        warn_unknown_names()

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
            from fenced_core.settings import get_settings

            s = get_settings()
            # On SQLite each try itself waits for the write lock, so the whole wait can be twice the window.
            each = (f", each try waiting up to {s.sqlite_busy_timeout_ms / 1000:g} s for the write lock"
                    if s.db_url.startswith("sqlite") else "")
            typer.echo(f"waiting for the run store (retrying for up to {retry_window_s():g} s{each})…", err=True)
        return False
