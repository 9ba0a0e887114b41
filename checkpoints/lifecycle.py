"""Run changes outside a holder: cancel, replay a dead letter, and the sweeper's closing of stale holds.

Each is one transaction; every state change in it goes through checkpoints.runs.change_state_txn.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from checkpoints import billing, ledger
from checkpoints.db import in_txn, transaction
from checkpoints.runs import change_state_txn, now_ms
from checkpoints.schema import TERMINAL_STATES, dead_letters, run_checkpoints, run_holds
from fenced_core.errors import InvalidRequest, RunNotFound
from fenced_core.settings import get_settings


@dataclass(frozen=True)
class Cancelled:
    run_id: str
    user_id: str
    previous_state: str
    epoch: int  # the canceller's epoch: any holder with a lower one is fenced out
    credits_charged: int | None
    noop: bool


def cancel(run_id: str, by: str, user_id: str | None = None,
           before_commit: Callable[[int], None] | None = None) -> Cancelled:
    """Cancel a queued, running or waiting run: a claim of its own (epoch + 1), the terminal state and
    the settlement of what was used, in one transaction. A running holder is fenced out on its next
    write, so no card or event of it lands after the cancel. A finished run is a no-op.

    `user_id`: the run must belong to this user (InvalidRequest otherwise, nothing written); None is an
    operator acting on any run. `before_commit(epoch)` runs inside the transaction, with the row locked
    and before the commit, with the canceller's epoch: the caller raises the Redis epoch mirror there,
    so the old holder's events are refused from before the cancel commits (the lock keeps any claim
    from taking that epoch first). It must not raise; it may run again if the transaction is retried."""
    return in_txn(_cancel_txn, run_id, by, user_id, before_commit)


def _cancel_txn(conn: Connection, run_id: str, by: str, user_id: str | None = None,
                before_commit: Callable[[int], None] | None = None) -> Cancelled:
    row = conn.execute(sa.select(run_checkpoints).where(run_checkpoints.c.run_id == run_id)
                       .with_for_update()).mappings().first()
    if row is None:
        raise RunNotFound(f"no run {run_id!r}")
    if user_id is not None and row["user_id"] != user_id:
        raise InvalidRequest(f"run {run_id} belongs to another user; nothing was cancelled")
    if row["state"] in TERMINAL_STATES:
        return Cancelled(run_id, row["user_id"], row["state"], row["epoch"], None, noop=True)
    now = now_ms()
    epoch = row["epoch"] + 1
    if before_commit is not None:
        before_commit(epoch)
    updated = change_state_txn(conn, run_id, row["state"], "cancelled", at_epoch=row["epoch"], what="cancel",
                               epoch=epoch, owner=None, error_class="cancelled", error=f"cancelled by {by}",
                               updated_at_ms=now, finished_at_ms=now)
    if updated != 1:  # the row is locked (FOR UPDATE; SQLite: BEGIN IMMEDIATE): only a broken lock gets here
        raise InvalidRequest(f"run {run_id} changed while it was being cancelled; nothing was cancelled")
    charge = billing.settle_txn(conn, run_id, epoch, by, row["prompt_tokens"], row["completion_tokens"], now)
    ledger.record_txn(conn, run_id, epoch, by, "cancelled",
                      f"cancelled while {row['state']} at step {row['step']}; the holder (if any) is fenced out",
                      {"previous_owner": row["owner"], "charge": charge})
    return Cancelled(run_id, row["user_id"], row["state"], epoch, charge, noop=False)


@dataclass(frozen=True)
class DeadLetter:
    run_id: str
    step: int
    reason: str
    attempts: list[dict[str, Any]]
    observations: dict[str, Any]
    at_ms: int
    replays: int
    replayed_at_ms: int | None
    replayed_by: str | None


def _dead_letter(row: Any) -> DeadLetter:
    return DeadLetter(row["run_id"], row["step"], row["reason"], json.loads(row["attempts"]),
                      json.loads(row["observations"] or "{}"), row["at_ms"], row["replays"],
                      row["replayed_at_ms"], row["replayed_by"])


def dead_letters_list(limit: int = 100, include_revived: bool = False) -> list[DeadLetter]:
    """Dead letters, newest first: runs that are dead now (a replayed run that went on, or was cancelled
    since, is no longer a dead letter), or every case file ever written with `include_revived`."""
    q = sa.select(dead_letters).order_by(dead_letters.c.at_ms.desc()).limit(limit)
    if not include_revived:
        q = q.join(run_checkpoints, run_checkpoints.c.run_id == dead_letters.c.run_id).where(
            run_checkpoints.c.state == "dead")
    with transaction(readonly=True) as conn:
        return [_dead_letter(r) for r in conn.execute(q).mappings().all()]


def dead_letter(run_id: str) -> DeadLetter:
    with transaction(readonly=True) as conn:
        row = conn.execute(sa.select(dead_letters).where(dead_letters.c.run_id == run_id)).mappings().first()
    if row is None:
        raise InvalidRequest(f"run {run_id} is not in the dead letters")
    return _dead_letter(row)


def replay(run_id: str, by: str) -> int:
    """Put a dead run back in the queue from its last checkpoint, with a fresh delivery budget.

    The replay pays for what it uses: a hold still open covers it; a hold already settled (the dead
    letter waited past the hold expiry) is reopened with a fresh hold, charged at the end only for the
    usage after the replay (billing.reopen_hold_txn). InsufficientCredits (or any refusal) writes
    nothing. Admission is the caller's (tasks.control.replay_dead_letter). Returns the step to wake; the
    caller sends the wake-up (the sweeper covers a lost send)."""
    return in_txn(_replay_txn, run_id, by)


def _replay_txn(conn: Connection, run_id: str, by: str) -> int:
    rc = run_checkpoints.c
    row = conn.execute(sa.select(rc.state, rc.step, rc.epoch, rc.phase, rc.user_id, rc.kind, rc.prompt_tokens,
                                 rc.completion_tokens)
                       .where(rc.run_id == run_id).with_for_update()).first()
    if row is None:
        raise RunNotFound(f"no run {run_id!r}")
    if row.state != "dead":
        raise InvalidRequest(f"run {run_id} is {row.state}; only dead runs can be replayed")
    now = now_ms()
    reopened = billing.reopen_hold_txn(conn, run_id, row.user_id, row.kind, row.epoch, by,
                                       int(row.prompt_tokens) + int(row.completion_tokens), now)
    change_state_txn(conn, run_id, "dead", "queued", at_epoch=row.epoch, what="replay", deliveries=0, owner=None,
                     error_class=None, error=None, finished_at_ms=None, updated_at_ms=now)
    conn.execute(dead_letters.update().where(dead_letters.c.run_id == run_id)
                 .values(replayed_at_ms=now, replayed_by=by, replays=dead_letters.c.replays + 1))
    hold = f"a fresh hold of {reopened} credits" if reopened is not None else "its open hold"
    ledger.record_txn(conn, run_id, row.epoch, by, "replayed",
                      f"dead letter replayed by {by}: resumes step {row.step} from checkpoint phase '{row.phase}' "
                      f"with a fresh delivery budget, paid by {hold}")
    return int(row.step)


# -- the sweeper's closings: holds nobody else will close ------------------------------------------------
_hc = run_holds.c
_rc = run_checkpoints.c


class Closed(NamedTuple):
    """A hold the sweeper closed: `outcome` is "released" (never run) or "settled" (dead, never replayed)."""

    run_id: str
    user_id: str
    outcome: str


def expire_holds_txn(conn: Connection, now_ms: int, actor: str, limit: int = 100) -> list[str]:
    """Close holds nobody else will (see close_stale_holds_txn); returns their run ids."""
    return [c.run_id for c in close_stale_holds_txn(conn, now_ms, actor, limit)]


def close_stale_holds_txn(conn: Connection, now_ms: int, actor: str, limit: int = 100) -> list[Closed]:
    """Release holds past expiry whose run was never claimed (such a run fails as expired), and settle
    what was used on holds of runs dead for longer than the hold expiry (a replay never came)."""
    return _expire_unclaimed_txn(conn, now_ms, actor, limit) + _settle_dead_txn(conn, now_ms, actor, limit)


def _expire_unclaimed_txn(conn: Connection, now_ms: int, actor: str, limit: int) -> list[Closed]:
    rows = conn.execute(
        sa.select(_hc.run_id, _hc.user_id)
        .join(run_checkpoints, _rc.run_id == _hc.run_id)
        .where(_hc.state == "held", _hc.expires_at_ms <= now_ms, _rc.state == "queued", _rc.epoch == 0)
        .limit(limit)
    ).all()
    closed = []
    for run_id, user_id in rows:
        claimed = change_state_txn(
            conn, run_id, "queued", "failed", at_epoch=0, what="expire", error_class="expired",
            error="no worker picked the run up before its hold expired", updated_at_ms=now_ms, finished_at_ms=now_ms)
        if not claimed:
            continue
        billing.release_txn(conn, run_id, 0, actor, "hold expired before any worker ran the run", now_ms)
        closed.append(Closed(run_id, user_id, "released"))
    return closed


def _settle_dead_txn(conn: Connection, now_ms: int, actor: str, limit: int) -> list[Closed]:
    dead_before = now_ms - get_settings().hold_expiry_s * 1000
    rows = conn.execute(
        sa.select(_hc.run_id)
        .join(run_checkpoints, _rc.run_id == _hc.run_id)
        .where(_hc.state == "held", _rc.state == "dead", _rc.finished_at_ms <= dead_before)
        .limit(limit)
    ).scalars().all()
    closed = []
    for run_id in rows:
        # Locked and read again: a replay that revives the run in between must win, not be settled.
        run = conn.execute(sa.select(_rc.user_id, _rc.epoch, _rc.state, _rc.finished_at_ms, _rc.prompt_tokens,
                                     _rc.completion_tokens)
                           .where(_rc.run_id == run_id).with_for_update()).first()
        if run is None or run.state != "dead" or (run.finished_at_ms or now_ms) > dead_before:
            continue
        why = f"dead for over {get_settings().hold_expiry_s} s and never replayed"
        charge = billing.settle_txn(conn, run_id, run.epoch, actor, int(run.prompt_tokens),
                                    int(run.completion_tokens), now_ms, why=why)
        if charge is not None:
            closed.append(Closed(run_id, run.user_id, "settled"))
    return closed
