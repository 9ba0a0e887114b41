"""Idempotent effects: a write tool's effect is keyed by run + action + payload fingerprint and fenced.

Replaying a recorded decision (after a crash, or by a zombie) hits the same key and gets the first
result back, unless that result can no longer be used (an expired card, say): then the replay performs
the effect again as a new operation, recorded as such. tasks.context.once is the agents' and tasks' way
in; an app with tables of its own (the shopping example's cart cards) uses perform_once through the
public fenced.store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from checkpoints import ledger
from checkpoints.db import in_txn
from checkpoints.runs import Claim, fenced_update_txn, now_ms
from checkpoints.schema import effects


def fingerprint(payload: Any) -> str:
    """A stable digest of a JSON payload (keys sorted); callers sort lists whose order is meaningless."""
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def request_key(run_id: str, action: str, payload: Any) -> str:
    """An effect's idempotency key, `run_id:action:fingerprint`: the same for every replay of one decision."""
    return f"{run_id}:{action}:{fingerprint(payload)}"


Create = Callable[[Connection, str], dict[str, Any]]  # (connection, request key) -> JSON-able result
# (connection, the recorded result) -> why that result can no longer be used, or None if it can.
Unusable = Callable[[Connection, dict[str, Any]], str | None]


def perform_once(c: Claim, action: str, payload: Any, create: Create,
                 unusable: Unusable | None = None) -> tuple[dict[str, Any], bool]:
    """Run `create` once per (run, action, payload) as holder `c`; returns (result, reused).

    The effect, its record and the fence check commit together: a fenced-out holder creates nothing,
    and a replay of the same decision, by anyone, gets the first result. If `unusable` says that
    result can no longer be used, the replay runs `create` again (a new operation, ledger
    `effect_renewed`) and the record points at the new result from then on."""
    key = request_key(c.run.run_id, action, payload)
    return in_txn(_perform_once_txn, c, action, key, create, unusable)


def _perform_once_txn(conn: Connection, c: Claim, action: str, key: str, create: Create,
                      unusable: Unusable | None) -> tuple[dict[str, Any], bool]:
    # The fenced update locks the run row: holders of this run's effects take their turn from here.
    fenced_update_txn(conn, c.run.run_id, c.epoch, f"{action} effect")
    done = conn.execute(sa.select(effects.c.result).where(effects.c.request_key == key)).scalar()
    if done is not None:
        first = json.loads(done)
        why = unusable(conn, first) if unusable else None
        if why is None:
            ledger.record_txn(conn, c.run.run_id, c.epoch, c.token, "effect_reused",
                              f"{action} replayed: request key {key} already done, first result returned")
            return first, True
        result = create(conn, key)
        conn.execute(effects.update().where(effects.c.request_key == key).values(
            result=json.dumps(result, sort_keys=True), epoch=c.epoch, created_at_ms=now_ms()))
        ledger.record_txn(conn, c.run.run_id, c.epoch, c.token, "effect_renewed",
                          f"{action} replayed: the recorded result {first} {why}; performed again as a new "
                          f"operation under {key}", {"previous": first, "result": result})
        return result, False
    try:
        with conn.begin_nested():
            result = create(conn, key)
            conn.execute(effects.insert().values(request_key=key, run_id=c.run.run_id, action=action,
                                                 result=json.dumps(result, sort_keys=True), epoch=c.epoch,
                                                 created_at_ms=now_ms()))
    except sa.exc.IntegrityError:
        # A concurrent holder with the same decision won the insert: its result is the result.
        first = conn.execute(sa.select(effects.c.result).where(effects.c.request_key == key)).scalar_one()
        return json.loads(first), True
    ledger.record_txn(conn, c.run.run_id, c.epoch, c.token, "effect_created", f"{action} done once: {key}",
                      {"key": key, "result": result})
    return result, False
