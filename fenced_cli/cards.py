"""`fenced cards` and `fenced confirm`: the cart confirmation cards an app offers (the shopping example's),
through tasks.service's card seam (the app registers its cards when FENCED_IMPORTS imports it)."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Annotated, Any

import typer
from rich.table import Table

from fenced_cli.common import JsonOpt, RunArg, _clock, app, emit_json, fail, out, resolve_run


def _fields(obj: Any) -> dict[str, Any]:
    """Every field of an app's card or order (a dataclass, or any object with attributes) for --json."""
    return asdict(obj) if is_dataclass(obj) and not isinstance(obj, type) else dict(vars(obj))


@app.command()
def cards(run_id: RunArg, as_json: JsonOpt = False) -> None:
    """The cart confirmation cards a run offered."""
    from tasks import service

    run = resolve_run(run_id)
    found = service.cards_of(run)
    if as_json:
        emit_json([_fields(c) for c in found])
        return
    table = Table("card", "state", "items", "total", "expires")
    for c in found:
        table.add_row(c.card_id, c.state, ", ".join(f"{i['qty']} x {i['name']}" for i in c.items),
                      f"${c.total_cents / 100:.2f}", _clock(c.expires_at_ms))
    out.print(table if found else "no cards")


@app.command()
def confirm(card_id: Annotated[str, typer.Argument(help="A card id (card_...).")],
            user: Annotated[str, typer.Option("--user", "-u", help="The card's owner.")] = "cli",
            as_json: JsonOpt = False) -> None:
    """Confirm a card: places one order (a second confirm prints the same order number)."""
    from fenced_core.errors import InvalidRequest
    from tasks import service

    try:
        order = service.confirm_card(card_id, user)
    except InvalidRequest as exc:
        fail(str(exc))
    if as_json:
        emit_json(_fields(order))
    else:
        typer.echo(order.order_id)
