"""API keys: issued once to a user, stored only as a SHA-256 digest; a key names its user and whether it is an admin.

Why a fast hash suffices: a key is 32 random bytes (secrets.token_urlsafe(32), 256 bits), so the stolen
table cannot be reversed by guessing, however fast the guesses; slow, salted hashes (bcrypt, argon2)
exist to protect guessable passwords. A plain digest also lets a request find its key with one indexed
equality lookup, and the comparison happens in the database on a digest, so timing reveals nothing
about the key itself.

The table is on its own MetaData (like the shopping example's tables): migration 0005 creates it.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy import BigInteger, Boolean, Column, Index, MetaData, String, Table

from checkpoints.db import db_retry, in_txn, transaction
from checkpoints.runs import now_ms
from checkpoints.schema import Ident

metadata = MetaData()

KEY_PREFIX = "fk_"
USER_ID_MAX = 128

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_hash", String(64), primary_key=True),  # hex SHA-256 of the whole key
    Column("user_id", Ident(USER_ID_MAX), nullable=False),
    Column("admin", Boolean, nullable=False),
    Column("created_at_ms", BigInteger, nullable=False),
    Column("revoked_at_ms", BigInteger),
    Index("ix_api_keys_user", "user_id"),
)

_k = api_keys.c


@dataclass(frozen=True)
class KeyOwner:
    """Whom a valid key was issued to."""

    user_id: str
    admin: bool


def digest(key: str) -> str:
    """The stored form of `key`: hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def issue(user_id: str, admin: bool = False) -> str:
    """A new key for `user_id`, returned once (only its digest is stored). Validates the user id.

    Under a crash: the row is committed or not; a key whose commit reply was lost is never shown, so it
    is simply never used (a retry issues a different key)."""
    if not user_id or len(user_id) > USER_ID_MAX or user_id != user_id.strip() or not user_id.isprintable():
        raise ValueError(f"user name: must be 1-{USER_ID_MAX} printable characters without surrounding spaces, "
                         f"got {user_id!r}")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    in_txn(lambda conn: conn.execute(api_keys.insert().values(
        key_hash=digest(key), user_id=user_id, admin=admin, created_at_ms=now_ms())))
    return key


@db_retry
def lookup(key: str) -> KeyOwner | None:
    """The owner of `key` if it was issued and not revoked, else None. Reads only (safe to retry)."""
    if not key or len(key) > 256:
        return None
    with transaction(readonly=True) as conn:
        row = conn.execute(sa.select(_k.user_id, _k.admin)
                           .where(_k.key_hash == digest(key), _k.revoked_at_ms.is_(None))).first()
    return None if row is None else KeyOwner(str(row.user_id), bool(row.admin))


def revoke_user(user_id: str) -> int:
    """Revoke every key of `user_id` (kept, marked revoked); returns how many were live. Idempotent."""
    return int(in_txn(lambda conn: conn.execute(
        api_keys.update().where(_k.user_id == user_id, _k.revoked_at_ms.is_(None))
        .values(revoked_at_ms=now_ms())).rowcount))
