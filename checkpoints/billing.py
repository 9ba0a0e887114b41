"""Billing holds: written with the run, settled once in the terminal transaction, released on expiry."""

from __future__ import annotations

import math

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from checkpoints import ledger
from checkpoints.schema import run_checkpoints, run_holds
from fenced.settings import get_settings


def hold_credits(kind: str) -> int:
    s = get_settings()
    return s.hold_large_credits if kind == "large" else s.hold_normal_credits


def credits_for(prompt_tokens: int, completion_tokens: int, held: int) -> int:
    """What a run's recorded usage costs, never more than its hold."""
    used = math.ceil((prompt_tokens + completion_tokens) * get_settings().credits_per_1k_tokens / 1000)
    return min(used, held)


def create_hold_txn(conn: Connection, run_id: str, user_id: str, kind: str, now_ms: int) -> int:
    credits = hold_credits(kind)
    conn.execute(run_holds.insert().values(
        run_id=run_id, user_id=user_id, credits_held=credits, state="held", credits_charged=None,
        created_at_ms=now_ms, expires_at_ms=now_ms + get_settings().hold_expiry_s * 1000,
    ))
    return credits


def settle_txn(conn: Connection, run_id: str, epoch: int, actor: str, prompt_tokens: int,
               completion_tokens: int, now_ms: int) -> int | None:
    """Settle the hold if it is still held (one conditional update); returns the charge, or None."""
    held = conn.execute(sa.select(run_holds.c.credits_held).where(run_holds.c.run_id == run_id)).scalar()
    if held is None:
        return None
    charge = credits_for(prompt_tokens, completion_tokens, held)
    done = conn.execute(run_holds.update()
                        .where(run_holds.c.run_id == run_id, run_holds.c.state == "held")
                        .values(state="settled", credits_charged=charge, closed_at_ms=now_ms)).rowcount
    if not done:
        ledger.record_txn(conn, run_id, epoch, actor, "settle_skipped", "hold was no longer held")
        return None
    ledger.record_txn(conn, run_id, epoch, actor, "settled",
                      f"charged {charge} of {held} held credits for {prompt_tokens + completion_tokens} tokens",
                      {"charge": charge, "held": held, "prompt_tokens": prompt_tokens,
                       "completion_tokens": completion_tokens})
    return charge


def expire_holds_txn(conn: Connection, now_ms: int, actor: str, limit: int = 100) -> list[str]:
    """Release holds past expiry whose run was never claimed; such a run fails as expired."""
    rows = conn.execute(
        sa.select(run_holds.c.run_id)
        .join(run_checkpoints, run_checkpoints.c.run_id == run_holds.c.run_id)
        .where(run_holds.c.state == "held", run_holds.c.expires_at_ms <= now_ms,
               run_checkpoints.c.state == "queued", run_checkpoints.c.epoch == 0)
        .limit(limit)
    ).scalars().all()
    expired = []
    for run_id in rows:
        claimed = conn.execute(run_checkpoints.update().where(
            run_checkpoints.c.run_id == run_id, run_checkpoints.c.epoch == 0,
            run_checkpoints.c.state == "queued",
        ).values(state="failed", error_class="expired", error="no worker picked the run up before its hold expired",
                 updated_at_ms=now_ms, finished_at_ms=now_ms)).rowcount
        if not claimed:
            continue
        conn.execute(run_holds.update().where(run_holds.c.run_id == run_id, run_holds.c.state == "held")
                     .values(state="released", credits_charged=0, closed_at_ms=now_ms))
        ledger.record_txn(conn, run_id, 0, actor, "hold_released", "hold expired before any worker ran the run")
        expired.append(run_id)
    return expired
