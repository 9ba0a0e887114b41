"""`fenced api` (serve the HTTP API with uvicorn) and `fenced users add|revoke` (issue and revoke API keys)."""

from __future__ import annotations

from typing import Annotated

import typer

from fenced_cli.common import CLI_DB_RETRY_S, app, fail

users = typer.Typer(name="users", help="API keys: issue one to a user, or revoke a user's keys.", no_args_is_help=True)
app.add_typer(users)


def _store() -> None:
    from checkpoints.db import migrate, set_retry_window
    from fenced_core.settings import get_settings

    set_retry_window(CLI_DB_RETRY_S)
    if get_settings().db_url.startswith("sqlite"):
        migrate()  # the embedded store makes its own schema (idempotent); MySQL/MariaDB: `fenced migrate`


@users.command("add")
def users_add(name: Annotated[str, typer.Argument(help="The user (runs are scoped and billed to this name).")],
              admin: Annotated[bool, typer.Option("--admin", help="May read and replay dead letters.")] = False,
              ) -> None:
    """Issue an API key for NAME and print it once: only its SHA-256 digest is stored, so keep it now."""
    from checkpoints import api_keys
    from checkpoints.db import is_missing_schema

    _store()
    try:
        key = api_keys.issue(name, admin=admin)
    except ValueError as exc:
        fail(str(exc))
    except Exception as exc:
        if is_missing_schema(exc):
            fail("the store has no api_keys table yet: run `fenced migrate`")
        raise
    typer.echo(key)


@users.command("revoke")
def users_revoke(name: Annotated[str, typer.Argument(help="The user whose keys stop working now.")]) -> None:
    """Revoke every key of NAME (requests with them get 401 from the next one on)."""
    from checkpoints import api_keys

    _store()
    typer.echo(f"revoked {api_keys.revoke_user(name)} key(s) of {name!r}")


@app.command()
def api(host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8000,
        log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info") -> None:
    """Serve the JSON API, the live view and the dashboard (uvicorn, one process; run more replicas on
    other ports behind a load balancer: they share nothing but the stores)."""
    import uvicorn

    uvicorn.run("fenced_api.app:create_app", factory=True, host=host, port=port, workers=1, log_level=log_level)
