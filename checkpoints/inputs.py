"""Waiting on a person: questions recorded under a tool-call id and the run's turn, and their replies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from checkpoints import ledger
from checkpoints.db import in_txn, transaction
from checkpoints.runs import Claim, change_state_txn, fenced_update_txn, now_ms
from checkpoints.schema import run_checkpoints, run_inputs
from fenced_core.errors import InvalidRequest


@dataclass(frozen=True)
class Input:
    run_id: str
    turn: int
    tool_call_id: str
    kind: str  # ask_user / fixable
    question: str
    reply: str | None
    asked_at_ms: int
    replied_at_ms: int | None


def _input(row: Any) -> Input:
    return Input(row["run_id"], row["turn"], row["tool_call_id"], row["kind"], row["question"], row["reply"],
                 row["asked_at_ms"], row["replied_at_ms"])


def ask(c: Claim, tool_call_id: str, turn: int, question: str, kind: str = "ask_user") -> str | None:
    """Record the question once (fenced); returns its reply if a person already answered it."""
    return in_txn(_ask_txn, c, tool_call_id, turn, question, kind)


def _ask_txn(conn: Connection, c: Claim, tool_call_id: str, turn: int, question: str, kind: str) -> str | None:
    fenced_update_txn(conn, c.run.run_id, c.epoch, f"question {tool_call_id}")
    where = (run_inputs.c.run_id == c.run.run_id, run_inputs.c.tool_call_id == tool_call_id)
    row = conn.execute(sa.select(run_inputs.c.reply).where(*where)).first()
    if row is not None:
        return row.reply  # asked before (a replay): never ask twice
    conn.execute(run_inputs.insert().values(run_id=c.run.run_id, turn=turn, tool_call_id=tool_call_id, kind=kind,
                                            question=question, epoch=c.epoch, asked_at_ms=now_ms()))
    return None


def reply(run_id: str, text: str, by: str, user_id: str | None = None) -> tuple[int, Input]:
    """Store the answer and set the run back to queued in ONE transaction; returns (step to wake, input).

    The caller then sends the wake-up; if that send is lost the sweeper sends it."""
    if not text.strip():
        raise InvalidRequest("the reply must not be empty")
    return in_txn(_reply_txn, run_id, text, by, user_id)


def _reply_txn(conn: Connection, run_id: str, text: str, by: str, user_id: str | None = None) -> tuple[int, Input]:
    run = conn.execute(sa.select(run_checkpoints.c.state, run_checkpoints.c.step, run_checkpoints.c.epoch,
                                 run_checkpoints.c.phase, run_checkpoints.c.user_id)
                       .where(run_checkpoints.c.run_id == run_id).with_for_update()).first()
    if run is None:
        raise InvalidRequest(f"no run {run_id!r}")
    if user_id is not None and run.user_id != user_id:  # None: an operator; else only the run's owner replies
        raise InvalidRequest(f"run {run_id} belongs to another user; nothing was stored")
    pending = conn.execute(sa.select(run_inputs).where(run_inputs.c.run_id == run_id, run_inputs.c.reply.is_(None))
                           .order_by(run_inputs.c.id.desc())).mappings().first()
    if run.state != "waiting" or pending is None:
        raise InvalidRequest(f"run {run_id} is {run.state}, not waiting for a reply")
    now = now_ms()
    conn.execute(run_inputs.update().where(run_inputs.c.id == pending["id"])
                 .values(reply=text, replied_at_ms=now, replied_by=by))
    # Answering is no failed delivery: the crash budget of the step starts afresh.
    values: dict[str, Any] = {"error_class": None, "error": None, "deliveries": 0,
                              "updated_at_ms": now}
    if pending["kind"] == "fixable":
        # The failed decision cannot be replayed as is: the model decides again, with the reply.
        values["phase"] = "done"
    change_state_txn(conn, run_id, "waiting", "queued", at_epoch=run.epoch, what="reply", **values)
    ledger.record_txn(conn, run_id, run.epoch, by, "replied",
                      f"reply to {pending['kind']} {pending['tool_call_id']} (turn {pending['turn']}); run queued")
    return run.step, _input({**pending, "reply": text, "replied_at_ms": now})


def for_run(run_id: str) -> list[Input]:
    with transaction(readonly=True) as conn:
        rows = conn.execute(sa.select(run_inputs).where(run_inputs.c.run_id == run_id)
                            .order_by(run_inputs.c.id)).mappings().all()
    return [_input(r) for r in rows]


def requeue_answered_txn(conn: Connection, actor: str, limit: int = 100) -> list[str]:
    """Runs `waiting` with no unanswered question go back to `queued` (the sweeper then wakes them).

    Parking and replying are each one conditional transaction, so this should find nothing; it is the
    net for a run that waits on a question already answered (which would otherwise wait forever)."""
    unanswered = sa.select(run_inputs.c.id).where(run_inputs.c.run_id == run_checkpoints.c.run_id,
                                                 run_inputs.c.reply.is_(None))
    rows = conn.execute(sa.select(run_checkpoints.c.run_id, run_checkpoints.c.epoch, run_checkpoints.c.step)
                        .where(run_checkpoints.c.state == "waiting", ~unanswered.exists())
                        .limit(limit)).all()
    found = []
    for run_id, epoch, step in rows:
        # updated_at_ms is left alone: the run is overdue already, and the same sweep wakes it.
        moved = change_state_txn(conn, run_id, "waiting", "queued", at_epoch=epoch, what="requeue", deliveries=0)
        if moved:
            ledger.record_txn(conn, run_id, epoch, actor, "requeued",
                              f"waiting at step {step} with every question answered: queued again")
            found.append(run_id)
    return found
