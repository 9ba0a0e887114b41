"""User accounts: a balance and the sum of open holds; a hold needs available credits (balance - held).

Every change is one conditional UPDATE inside the caller's transaction, guarded so that a balance
never goes negative. The updates are relative (`held + h`), so billing.py makes each ride on a
once-only change in the same transaction: the run row's insert at submit, the hold leaving `held` at
settlement or release. A retried transaction therefore never moves credits twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from checkpoints.db import transaction
from checkpoints.schema import user_accounts
from fenced_core.errors import InsufficientCredits
from fenced_core.settings import get_settings

_acc = user_accounts.c


@dataclass(frozen=True)
class Account:
    """A user's credits; a user never seen has the default balance and nothing held."""

    user_id: str
    balance_credits: int
    held_credits: int

    @property
    def available_credits(self) -> int:
        return self.balance_credits - self.held_credits


def get_account(user_id: str) -> Account:
    """The user's account as stored, or the default one for a user never seen (nothing is written)."""
    with transaction(readonly=True) as conn:
        return account_txn(conn, user_id)


def account_txn(conn: Connection, user_id: str) -> Account:
    row = conn.execute(sa.select(_acc.balance_credits, _acc.held_credits).where(_acc.user_id == user_id)).first()
    if row is None:
        return Account(user_id, get_settings().default_balance_credits, 0)
    return Account(user_id, int(row.balance_credits), int(row.held_credits))


def ensure_txn(conn: Connection, user_id: str, now_ms: int) -> None:
    """Create the user's account with the default balance unless it exists (MySQL and SQLite alike)."""
    if conn.execute(sa.select(_acc.user_id).where(_acc.user_id == user_id)).first() is not None:
        return
    try:
        # A savepoint, so losing the race to a concurrent first submit of the same user keeps our txn.
        with conn.begin_nested():
            conn.execute(user_accounts.insert().values(
                user_id=user_id, balance_credits=get_settings().default_balance_credits, held_credits=0,
                updated_at_ms=now_ms))
    except sa.exc.IntegrityError:
        pass


def hold_txn(conn: Connection, user_id: str, credits: int, now_ms: int) -> None:
    """Add a hold of `credits` if the available credits cover it; otherwise raise InsufficientCredits
    (the caller's transaction then rolls back: nothing written)."""
    ensure_txn(conn, user_id, now_ms)
    held = conn.execute(user_accounts.update()
                        .where(_acc.user_id == user_id, _acc.balance_credits - _acc.held_credits >= credits)
                        .values(held_credits=_acc.held_credits + credits, updated_at_ms=now_ms)).rowcount
    if not held:
        raise InsufficientCredits(user_id, credits, account_txn(conn, user_id).available_credits)


def charge_txn(conn: Connection, user_id: str, credits_held: int, charge: int, now_ms: int) -> bool:
    """Settle one hold: the charge leaves the balance, the hold leaves `held`. False (nothing changed)
    if the account does not carry the hold: a hold from before accounts existed, or a hand-edited row."""
    return bool(conn.execute(user_accounts.update()
                             .where(_acc.user_id == user_id, _acc.held_credits >= credits_held,
                                    _acc.balance_credits >= charge)
                             .values(balance_credits=_acc.balance_credits - charge,
                                     held_credits=_acc.held_credits - credits_held, updated_at_ms=now_ms)
                             ).rowcount)


def release_txn(conn: Connection, user_id: str, credits_held: int, now_ms: int) -> bool:
    """Release one hold without a charge. False (nothing changed) if the account does not carry it."""
    return charge_txn(conn, user_id, credits_held, 0, now_ms)



_HOLDERS_LOCKED = sa.select(_acc.user_id, _acc.balance_credits, _acc.held_credits).where(
    _acc.user_id.in_(sa.bindparam("w_users", expanding=True))).with_for_update()
_ADD_HELD = user_accounts.update().where(
    _acc.user_id == sa.bindparam("w_user_id"), _acc.balance_credits - _acc.held_credits >= sa.bindparam("w_credits"),
).values(held_credits=_acc.held_credits + sa.bindparam("w_credits"), updated_at_ms=sa.bindparam("v_updated_at_ms"))


def hold_many_txn(conn: Connection, needs: list[tuple[str, int]], now_ms: int) -> list[int | None]:
    """`hold_txn` for each (user_id, credits) in order, in a few statements: the users' accounts are
    created if missing and locked, each hold is granted while the user's available credits cover it,
    and one guarded UPDATE per user adds what was granted. Returns, per entry, None (held) or the
    credits that were available when it was refused (nothing held for it). Inside the caller's
    transaction: a rollback undoes every hold, a retried transaction starts afresh."""
    users = sorted({u for u, _ in needs})
    rows = {r.user_id: r for r in conn.execute(_HOLDERS_LOCKED, {"w_users": users}).all()}
    missing = [u for u in users if u not in rows]
    if missing:
        for user_id in missing:
            ensure_txn(conn, user_id, now_ms)
        rows.update({r.user_id: r for r in conn.execute(_HOLDERS_LOCKED, {"w_users": missing}).all()})
    available = {u: int(rows[u].balance_credits) - int(rows[u].held_credits) for u in users}
    added = dict.fromkeys(users, 0)
    out: list[int | None] = []
    for user_id, credits in needs:
        if credits <= available[user_id]:
            available[user_id] -= credits
            added[user_id] += credits
            out.append(None)
        else:
            out.append(available[user_id])
    for user_id, credits in added.items():
        if credits and not conn.execute(_ADD_HELD, {"w_user_id": user_id, "w_credits": credits,
                                                    "v_updated_at_ms": now_ms}).rowcount:
            # The row is locked above: only a store without row locks gets here. Roll the batch back.
            raise RuntimeError(f"account of {user_id!r} changed while its holds were being added")
    return out
