"""The ledger: every decision a person may later question, with its reason, one row each."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from checkpoints.db import in_txn, transaction
from checkpoints.schema import run_ledger

_INSERT = run_ledger.insert()  # built once: constructing a statement per call costs ~0.1 ms of CPU
# The same insert for a raw multi-statement query (checkpoints.db.raw_txn), its parameters raw_params(...);
# RAW_INSERT_IF % "@fenced = 1" adds the entry only where the SQL condition holds.
RAW_INSERT = ("INSERT INTO run_ledger (run_id, at_ms, epoch, actor, kind, reason, detail) "
              "VALUES (%s, %s, %s, %s, %s, %s, %s)")
RAW_INSERT_IF = ("INSERT INTO run_ledger (run_id, at_ms, epoch, actor, kind, reason, detail) "
                 "SELECT %%s, %%s, %%s, %%s, %%s, %%s, %%s FROM DUAL WHERE %s")


@dataclass(frozen=True)
class Entry:
    id: int
    run_id: str
    at_ms: int
    epoch: int
    actor: str
    kind: str
    reason: str
    detail: dict[str, Any]


def encode_detail(detail: dict[str, Any] | None) -> str | None:
    """An entry's detail as stored: sorted JSON, or NULL when there is none."""
    return json.dumps(detail, sort_keys=True, default=str) if detail else None


def record_txn(conn: Connection, run_id: str, epoch: int, actor: str, kind: str, reason: str,
               detail: dict[str, Any] | None = None) -> None:
    """Add one entry inside the caller's transaction (so it commits with the decision it explains)."""
    conn.execute(_INSERT, _row(run_id, epoch, actor, kind, reason, detail))


def _row(run_id: str, epoch: int, actor: str, kind: str, reason: str,
         detail: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"run_id": run_id, "at_ms": int(time.time() * 1000), "epoch": epoch, "actor": actor, "kind": kind,
            "reason": reason, "detail": encode_detail(detail)}


def raw_params(run_id: str, epoch: int, actor: str, kind: str, reason: str,
               detail: dict[str, Any] | None = None) -> tuple[Any, ...]:
    """record_txn's values, in RAW_INSERT_IF's order."""
    return (run_id, int(time.time() * 1000), epoch, actor, kind, reason, encode_detail(detail))


def record(run_id: str, epoch: int, actor: str, kind: str, reason: str,
           detail: dict[str, Any] | None = None) -> None:
    """Add one entry in its own transaction (for decisions that write nothing else)."""
    in_txn(record_txn, run_id, epoch, actor, kind, reason, detail)


def record_many(entries: list[tuple[str, int, str, str, str]]) -> None:
    """Add (run_id, epoch, actor, kind, reason) entries, none with a detail, in one transaction."""
    if entries:
        in_txn(lambda conn: conn.execute(_INSERT, [_row(*entry) for entry in entries]))


def history(run_id: str) -> list[Entry]:
    """A run's ledger, oldest first."""
    with transaction(readonly=True) as conn:
        rows = conn.execute(sa.select(run_ledger).where(run_ledger.c.run_id == run_id)
                            .order_by(run_ledger.c.id)).mappings().all()
    return [Entry(r["id"], r["run_id"], r["at_ms"], r["epoch"], r["actor"], r["kind"], r["reason"],
                  json.loads(r["detail"]) if r["detail"] else {}) for r in rows]
