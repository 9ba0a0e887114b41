"""identifiers compare byte for byte, 64-bit card totals, reopenable holds, backfill of what 0002 left out

Revision ID: 0003
Revises: 0002

- MySQL/MariaDB: every identifier column (user, run, card, request key, operation, order, tool call ids)
  gets a binary, no-pad collation, so `alice`, `Alice`, `alice ` and `alicé` are different keys (the
  server default collation is case- and accent-insensitive). SQLite compares bytes already.
- cart_cards.total_cents becomes BIGINT (SQLite's INTEGER is 64-bit already).
- run_holds gets credits_charged_before / tokens_settled_before: a dead letter replayed after its hold
  was settled reopens the hold, and the earlier charge stays on record without being charged again.
- Backfill of 0002 on a database that had data: cards from before 0002 get their run's user as owner
  and an expiry of created_at_ms + card_ttl_s; orders from before 0002 get their card's user; every
  user with open holds has an account, and every account's held_credits is the sum of its open holds.
  Run it with the workers stopped (as any migration): a hold taken while the sum is computed could be
  missed.
"""

from __future__ import annotations

import os
import time

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

# table -> (column, length, nullable, server default)
IDENTIFIERS: dict[str, list[tuple[str, int, bool, str | None]]] = {
    'run_checkpoints': [('run_id', 64, False, None), ('user_id', 128, False, None)],
    'run_steps': [('run_id', 64, False, None)],
    'run_holds': [('run_id', 64, False, None), ('user_id', 128, False, None)],
    'run_attempts': [('run_id', 64, False, None)],
    'run_ledger': [('run_id', 64, False, None)],
    'effects': [('request_key', 255, False, None), ('run_id', 64, False, None)],
    'cart_cards': [('card_id', 64, False, None), ('request_key', 255, False, None), ('run_id', 64, False, None),
                   ('user_id', 128, False, ''), ('operation_id', 64, False, None)],
    'orders': [('order_id', 64, False, None), ('operation_id', 64, False, None), ('card_id', 64, False, None),
               ('user_id', 128, False, '')],
    'run_inputs': [('run_id', 64, False, None), ('tool_call_id', 64, False, None), ('replied_by', 128, True, None)],
    'user_accounts': [('user_id', 128, False, None)],
    'dead_letters': [('run_id', 64, False, None), ('replayed_by', 128, True, None)],
}


def _binary_collation(dialect: sa.engine.Dialect) -> str:
    """Same choice as checkpoints.schema.binary_collation (kept here so this migration never changes)."""
    if getattr(dialect, 'is_mariadb', False):
        return 'utf8mb4_nopad_bin'
    return 'utf8mb4_0900_bin' if tuple(dialect.server_version_info or ()) >= (8, 0, 17) else 'utf8mb4_bin'


def _modify(column: str, length: int, nullable: bool, default: str | None, collation: str | None) -> str:
    charset = f' CHARACTER SET utf8mb4 COLLATE {collation}' if collation else ''
    return (f"MODIFY {column} VARCHAR({length}){charset} {'NULL' if nullable else 'NOT NULL'}"
            + (f" DEFAULT '{default}'" if default is not None else ''))


def upgrade() -> None:
    bind = op.get_bind()
    with op.batch_alter_table('run_holds', schema=None) as batch_op:
        batch_op.add_column(sa.Column('credits_charged_before', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('tokens_settled_before', sa.BigInteger(), server_default='0', nullable=False))
    if bind.dialect.name == 'mysql':
        collation = _binary_collation(bind.dialect)
        for table, columns in IDENTIFIERS.items():
            clauses = [_modify(*col, collation) for col in columns]
            if table == 'cart_cards':
                clauses.append('MODIFY total_cents BIGINT NOT NULL')
            op.execute(f"ALTER TABLE {table} {', '.join(clauses)}")
    _backfill(bind)


def _backfill(bind: sa.engine.Connection) -> None:
    from fenced_core.settings import get_settings

    settings = get_settings()
    now = int(time.time() * 1000)
    bind.execute(sa.text(
        "UPDATE cart_cards SET user_id = (SELECT r.user_id FROM run_checkpoints r WHERE r.run_id = cart_cards.run_id) "
        "WHERE user_id = '' AND EXISTS (SELECT 1 FROM run_checkpoints r WHERE r.run_id = cart_cards.run_id)"))
    # The card TTL is the shopping example's setting now (examples/shopping/settings.py); the migration reads
    # the same variable with the same default rather than import the example.
    card_ttl_s = int(os.environ.get("FENCED_CARD_TTL_S", "1800"))
    bind.execute(sa.text("UPDATE cart_cards SET expires_at_ms = created_at_ms + :ttl_ms WHERE expires_at_ms = 0"),
                 {'ttl_ms': card_ttl_s * 1000})
    bind.execute(sa.text(
        "UPDATE orders SET user_id = (SELECT c.user_id FROM cart_cards c WHERE c.card_id = orders.card_id) "
        "WHERE user_id = '' AND EXISTS (SELECT 1 FROM cart_cards c WHERE c.card_id = orders.card_id)"))
    bind.execute(sa.text(
        "INSERT INTO user_accounts (user_id, balance_credits, held_credits, updated_at_ms) "
        "SELECT DISTINCT h.user_id, :balance, 0, :now FROM run_holds h WHERE h.state = 'held' "
        "AND NOT EXISTS (SELECT 1 FROM user_accounts a WHERE a.user_id = h.user_id)"),
        {'balance': settings.default_balance_credits, 'now': now})
    open_holds = ("COALESCE((SELECT SUM(h.credits_held) FROM run_holds h "
                  "WHERE h.state = 'held' AND h.user_id = user_accounts.user_id), 0)")
    bind.execute(sa.text(f"UPDATE user_accounts SET held_credits = {open_holds}, updated_at_ms = :now "
                         f"WHERE held_credits <> {open_holds}"), {'now': now})


def downgrade() -> None:
    """Back to the server's default collation: fails (duplicate key) if ids that differ only in case,
    accents or trailing spaces now coexist. The backfilled values stay."""
    bind = op.get_bind()
    if bind.dialect.name == 'mysql':
        for table, columns in IDENTIFIERS.items():
            clauses = [_modify(*col, None) for col in columns]
            if table == 'cart_cards':
                clauses.append('MODIFY total_cents INTEGER NOT NULL')
            op.execute(f"ALTER TABLE {table} {', '.join(clauses)}")
    with op.batch_alter_table('run_holds', schema=None) as batch_op:
        batch_op.drop_column('tokens_settled_before')
        batch_op.drop_column('credits_charged_before')
