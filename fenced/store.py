"""An app's own tables beside the run store: transactions, once-only effects, ledger entries, run states.

An app that keeps its own rows (the shopping example's cart cards and orders) writes them through these,
so they commit in the same database transaction as fenced's own bookkeeping. Read-through wrappers over
the runtime (checkpoints); the runtime stays where it is and this module is the public door to it.

What holds under a crash: every function here is one database transaction (or runs inside the
caller's), so its rows, the fence check and the ledger entry commit together or not at all.
What holds under a takeover: `perform_once` checks the caller's epoch in the same transaction, so a
holder fenced out by a newer claim writes nothing (it raises FencedOut) and the new holder's replay
performs the effect once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from checkpoints import db as _db
from checkpoints import effects as _effects
from checkpoints import ledger as _ledger
from checkpoints import runs as _runs
from checkpoints import schema as _schema
from tasks.context import RunContext

T = TypeVar("T")

Ident = _schema.Ident
"""The column type for identifiers (ids, keys, user names): compared byte for byte on every database."""

Claim = _runs.Claim
"""A holder's ownership of a run (`claim.epoch` is its fencing token); `fenced.current_run().claim`."""

RUN_STATES: tuple[str, ...] = _schema.RUN_STATES
"""Every state a run row can be in."""

TERMINAL_STATES: tuple[str, ...] = _schema.TERMINAL_STATES
"""The states a run ends in (done, failed, cancelled, dead); a run never leaves one except by a replay
of a dead letter."""

ENDED_UNFINISHED_STATES: tuple[str, ...] = tuple(s for s in _schema.TERMINAL_STATES if s != "done")
"""The states of a run that ended without finishing its work (or was stopped): an app refuses to act
on its effects (a card of a cancelled run cannot be confirmed)."""

Create = _effects.Create
Unusable = _effects.Unusable


def now_ms() -> int:
    """Wall-clock milliseconds, the unit of every `*_ms` column of the run store."""
    return _runs.now_ms()


@contextmanager
def transaction(readonly: bool = False) -> Iterator[Connection]:
    """One transaction on the run store's database (a SQLAlchemy Connection), for an app's own tables.

    Under a crash it commits whole or not at all. Not retried: a transient driver error leaves as
    StoreUnavailable (use `in_transaction` for a write that should be retried as a whole)."""
    with _db.transaction(readonly=readonly) as conn:
        yield conn


def in_transaction(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run `fn(conn, *args, **kwargs)` in one transaction, retried as a whole on transient errors.

    `fn` may run more than once (each attempt rolled back before the next), so it must not call the
    outside world; after the retry window it raises StoreUnavailable and nothing was committed."""
    return _db.in_txn(fn, *args, **kwargs)


def perform_once(holder: Claim | RunContext, action: str, payload: Any, create: Create,
                 unusable: Unusable | None = None) -> tuple[dict[str, Any], bool]:
    """Run `create(conn, request_key)` once per (run, action, payload); returns (result, reused).

    `holder` is the claim (or the run context, `fenced.current_run()`) the effect is fenced by;
    `payload` is what the recorded decision says (sort lists whose order is meaningless); `create`
    writes the app's rows in the same transaction and returns a JSON-able result.

    Under a crash: the effect, its record and the fence check commit together, so a crash leaves the
    effect done and recorded, or neither. Under a takeover: a holder fenced out by a newer claim writes
    nothing (FencedOut), and a replay of the same decision, by anyone, gets the first result with
    `reused` True. If `unusable(conn, first_result)` names a reason the first result can no longer be
    used (an expired card), the replay runs `create` again as a new operation (ledger `effect_renewed`)."""
    claim = holder.claim if isinstance(holder, RunContext) else holder
    return _effects.perform_once(claim, action, payload, create, unusable)


def ledger_append(conn: Connection, run_id: str, epoch: int, actor: str, kind: str, reason: str,
                  detail: dict[str, Any] | None = None) -> None:
    """Add one ledger entry for `run_id` inside the caller's transaction, so it commits (or is lost by a
    crash) together with the decision it explains; `fenced status` and `fenced explain` show it."""
    _ledger.record_txn(conn, run_id, epoch, actor, kind, reason, detail)


@dataclass(frozen=True)
class RunState:
    """A run's state and current epoch as read inside a transaction."""

    state: str
    epoch: int


def run_state(conn: Connection, run_id: str, lock: bool = True) -> RunState | None:
    """The run's state and epoch in the caller's transaction (None: no such run).

    With `lock` (the default) the row is read under a shared lock: a cancel or ending of the run waits
    for the caller's commit, or the caller sees it ended; so an app's write that checks the run is live
    (an order from a card) cannot interleave with the run ending."""
    rc = _schema.run_checkpoints.c
    query = sa.select(rc.state, rc.epoch).where(rc.run_id == run_id)
    if lock:
        query = query.with_for_update(read=True)
    row = conn.execute(query).first()
    return None if row is None else RunState(str(row.state), int(row.epoch))


__all__ = ["ENDED_UNFINISHED_STATES", "RUN_STATES", "TERMINAL_STATES", "Claim", "Create", "Ident", "RunState",
           "Unusable", "in_transaction", "ledger_append", "now_ms", "perform_once", "run_state", "transaction"]
