"""Billing holds: written with the run, settled once in the terminal transaction, released on expiry.

Each hold is mirrored in the user's account (checkpoints.accounts): `held` grows at submit, and the
one conditional update that closes the hold (`state = 'held'` -> settled/released) is the only thing
that lets the account change again, so a balance moves once per closing of the hold.

A dead letter replayed after its hold was closed reopens it (reopen_hold_txn): a fresh hold on the
account, the earlier charge kept on record (`credits_charged_before`) and the tokens it covered
(`tokens_settled_before`) never charged again: the next settlement charges only the usage since.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from checkpoints import accounts, ledger
from checkpoints.db import transaction
from checkpoints.schema import run_holds
from fenced_core.errors import InsufficientCredits
from fenced_core.settings import get_settings

_h = run_holds.c


def holds_for(run_id: str) -> list[dict[str, Any]]:
    """A run's billing hold rows as stored (one is expected), as plain dicts."""
    with transaction(readonly=True) as conn:
        return [dict(r) for r in conn.execute(sa.select(run_holds).where(_h.run_id == run_id)).mappings().all()]


def hold_credits(kind: str) -> int:
    s = get_settings()
    return s.hold_large_credits if kind == "large" else s.hold_normal_credits


def credits_for(prompt_tokens: int, completion_tokens: int, held: int) -> int:
    """What a run's recorded usage costs, never more than its hold."""
    used = math.ceil((prompt_tokens + completion_tokens) * get_settings().credits_per_1k_tokens / 1000)
    return min(used, held)


def hold_expires_at(now_ms: int) -> int:
    """When a hold taken at `now_ms` expires (settings.hold_expiry_s later)."""
    return now_ms + get_settings().hold_expiry_s * 1000


def create_hold_txn(conn: Connection, run_id: str, user_id: str, kind: str, now_ms: int) -> int:
    """Hold the run's credits on the user's account and record the hold; returns the credits held.

    Raises InsufficientCredits when the available credits do not cover it (the caller's transaction,
    which also inserts the run row, rolls back: nothing written)."""
    credits = hold_credits(kind)
    accounts.hold_txn(conn, user_id, credits, now_ms)
    conn.execute(run_holds.insert().values(
        run_id=run_id, user_id=user_id, credits_held=credits, state="held", credits_charged=None,
        created_at_ms=now_ms, expires_at_ms=hold_expires_at(now_ms),
    ))
    return credits


@dataclass(frozen=True)
class _Settlement:
    """What closing a hold charges, and the ledger entry that says so."""

    user_id: str
    held: int
    charge: int
    reason: str
    detail: dict[str, Any]


def _settlement(user_id: str, held: int, before: int, prompt_tokens: int, completion_tokens: int,
                why: str) -> _Settlement:
    tokens = max(prompt_tokens + completion_tokens - before, 0)  # a reopened hold: `before` was settled already
    charge = credits_for(tokens, 0, held)
    reason = f"charged {charge} of {held} held credits for {tokens} tokens"
    if before:
        reason += f" used since the hold was reopened ({before} tokens were settled before)"
    return _Settlement(user_id, held, charge, f"{why}: {reason}" if why else reason,
                       {"charge": charge, "held": held, "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens, "tokens_settled_before": before})


def _mismatch(user_id: str, held: int, charge: int) -> tuple[str, dict[str, Any]]:
    return (f"account of {user_id!r} does not carry this hold of {held} credits; left unchanged",
            {"held": held, "charge": charge})


_SKIPPED = ("settle_skipped", "hold was no longer held")


def settle_txn(conn: Connection, run_id: str, epoch: int, actor: str, prompt_tokens: int,
               completion_tokens: int, now_ms: int, why: str = "") -> int | None:
    """Settle the hold if it is still held (one conditional update); returns the charge, or None.

    `why` prefixes the ledger's reason when the settlement is not the run's own terminal write. A
    reopened hold charges only the tokens used since it was reopened."""
    hold = conn.execute(sa.select(_h.credits_held, _h.user_id, _h.tokens_settled_before)
                        .where(_h.run_id == run_id)).first()
    if hold is None:
        return None
    s = _settlement(hold.user_id, int(hold.credits_held), int(hold.tokens_settled_before), prompt_tokens,
                    completion_tokens, why)
    done = conn.execute(run_holds.update()
                        .where(_h.run_id == run_id, _h.state == "held")
                        .values(state="settled", credits_charged=s.charge, closed_at_ms=now_ms)).rowcount
    if not done:
        ledger.record_txn(conn, run_id, epoch, actor, *_SKIPPED)
        return None
    _account_txn(conn, run_id, epoch, actor, s.user_id, s.held, s.charge, now_ms)
    ledger.record_txn(conn, run_id, epoch, actor, "settled", s.reason, s.detail)
    return s.charge


# settle_txn for a raw multi-statement query (checkpoints.db.raw_txn: MySQL/MariaDB, and SQLite through
# checkpoints.sqlite_multi): the hold read locked in an earlier query of the same transaction, then
# settle_raw's statements.
RAW_HOLD_LOCKED = ("SELECT credits_held, user_id, tokens_settled_before, state FROM run_holds "
                   "WHERE run_id = %s FOR UPDATE")
_RAW_SETTLE = ("UPDATE run_holds SET state = 'settled', credits_charged = %s, closed_at_ms = %s "
               "WHERE run_id = %s AND state = 'held'")
_RAW_CHARGE = ("UPDATE user_accounts SET balance_credits = balance_credits - %s, held_credits = held_credits - %s, "
               "updated_at_ms = %s WHERE user_id = %s AND held_credits >= %s AND balance_credits >= %s")


def settle_raw(hold: tuple[Any, ...] | None, run_id: str, epoch: int, actor: str, prompt_tokens: int,
               completion_tokens: int, now_ms: int) -> tuple[int | None, list[str], list[Any]]:
    """settle_txn as statements for the rest of a raw transaction: (the charge or None, the statements,
    their parameters). `hold` is RAW_HOLD_LOCKED's row (None: no hold), locked since it was read, so the
    settlement decided here is the one the statements make; the account check stays in SQL (a mismatch
    entry only where the account update matched nothing), as charge_txn makes it."""
    if hold is None:
        return None, [], []
    credits_held, user_id, before, state = hold
    if state != "held":
        return None, [ledger.RAW_INSERT], [*ledger.raw_params(run_id, epoch, actor, *_SKIPPED)]
    s = _settlement(user_id, int(credits_held), int(before), prompt_tokens, completion_tokens, "")
    charge = [s.charge, s.held, now_ms, s.user_id, s.held, s.charge]  # _RAW_CHARGE's (charge_txn's) parameters
    statements = [_RAW_SETTLE, _RAW_CHARGE, "SET @charged = ROW_COUNT()", ledger.RAW_INSERT_IF % "@charged = 0",
                  ledger.RAW_INSERT]
    params = [s.charge, now_ms, run_id, *charge,
              *ledger.raw_params(run_id, epoch, actor, "account_mismatch", *_mismatch(s.user_id, s.held, s.charge)),
              *ledger.raw_params(run_id, epoch, actor, "settled", s.reason, s.detail)]
    return s.charge, statements, params


def reopen_hold_txn(conn: Connection, run_id: str, user_id: str, kind: str, epoch: int, actor: str,
                    tokens_used: int, now_ms: int) -> int | None:
    """Give a run whose hold was closed (a dead letter settled by the sweeper) a fresh hold for what it
    uses from here; returns the credits held, or None if its hold is still open (it covers the rest).

    The run's own hold row is reopened: `held` again with a fresh amount on the account, the earlier
    charge added to `credits_charged_before`, and `tokens_settled_before` set to the usage so far
    (`tokens_used`), which the closing covered; the next settlement charges only what comes after.
    Raises InsufficientCredits when the available credits do not cover the hold (the caller's
    transaction rolls back: nothing written)."""
    hold = conn.execute(sa.select(_h.state, _h.credits_held, _h.credits_charged, _h.credits_charged_before)
                        .where(_h.run_id == run_id).with_for_update()).first()
    if hold is not None and hold.state == "held":
        return None
    credits = hold_credits(kind)
    accounts.hold_txn(conn, user_id, credits, now_ms)
    expires = hold_expires_at(now_ms)
    if hold is None:  # a run from before holds existed: nothing of it was ever charged
        conn.execute(run_holds.insert().values(
            run_id=run_id, user_id=user_id, credits_held=credits, state="held", credits_charged=None,
            created_at_ms=now_ms, expires_at_ms=expires))
        ledger.record_txn(conn, run_id, epoch, actor, "hold_reopened", f"{credits} credits held for the replay",
                          {"held": credits})
        return credits
    charged = int(hold.credits_charged or 0)
    reopened = conn.execute(run_holds.update().where(_h.run_id == run_id, _h.state == hold.state).values(
        state="held", credits_held=credits, credits_charged=None, closed_at_ms=None, expires_at_ms=expires,
        credits_charged_before=_h.credits_charged_before + charged, tokens_settled_before=tokens_used,
    )).rowcount
    if not reopened:  # the row is locked above; only a broken lock gets here
        raise RuntimeError(f"hold of run {run_id} changed while it was being reopened")
    ledger.record_txn(conn, run_id, epoch, actor, "hold_reopened",
                      f"hold was {hold.state} ({charged} of {hold.credits_held} credits charged); {credits} credits "
                      f"held for the replay, charged only for usage after the {tokens_used} tokens already settled",
                      {"held": credits, "previous_state": hold.state, "previous_charge": charged,
                       "charged_before": int(hold.credits_charged_before) + charged,
                       "tokens_settled_before": tokens_used})
    return credits


def release_txn(conn: Connection, run_id: str, epoch: int, actor: str, reason: str, now_ms: int) -> bool:
    """Release the hold without a charge if it is still held (cancel, expiry); True if this call did."""
    hold = conn.execute(sa.select(_h.credits_held, _h.user_id).where(_h.run_id == run_id)).first()
    if hold is None:
        return False
    done = conn.execute(run_holds.update().where(_h.run_id == run_id, _h.state == "held")
                        .values(state="released", credits_charged=0, closed_at_ms=now_ms)).rowcount
    if not done:
        return False
    _account_txn(conn, run_id, epoch, actor, hold.user_id, int(hold.credits_held), 0, now_ms)
    ledger.record_txn(conn, run_id, epoch, actor, "hold_released", reason, {"held": int(hold.credits_held)})
    return True


def _account_txn(conn: Connection, run_id: str, epoch: int, actor: str, user_id: str, held: int, charge: int,
                 now_ms: int) -> None:
    """Move the closed hold out of the user's account; a mismatch is recorded, never forced negative."""
    if not accounts.charge_txn(conn, user_id, held, charge, now_ms):
        ledger.record_txn(conn, run_id, epoch, actor, "account_mismatch", *_mismatch(user_id, held, charge))


_INSERT_HOLD = run_holds.insert()


def create_holds_txn(conn: Connection, holds: list[tuple[str, str, str]], now_ms: int
                     ) -> list[int | InsufficientCredits]:
    """`create_hold_txn` for each (run_id, user_id, kind) in order, in a few statements: returns, per
    entry, the credits held, or the InsufficientCredits refusal when the user's available credits did
    not cover it (then nothing is held or recorded for that run). Inside the
    caller's transaction, which also inserts the runs' rows: a rollback undoes every hold."""
    credits = [hold_credits(kind) for _, _, kind in holds]
    refused = accounts.hold_many_txn(conn, [(user_id, c) for (_, user_id, _), c in zip(holds, credits, strict=True)],
                                     now_ms)
    expires = hold_expires_at(now_ms)
    granted = [{"run_id": run_id, "user_id": user_id, "credits_held": c, "state": "held", "credits_charged": None,
                "created_at_ms": now_ms, "expires_at_ms": expires}
               for (run_id, user_id, _), c, r in zip(holds, credits, refused, strict=True) if r is None]
    if granted:
        conn.execute(_INSERT_HOLD, granted)
    return [c if r is None else InsufficientCredits(user_id, c, r)
            for (_, user_id, _), c, r in zip(holds, credits, refused, strict=True)]
