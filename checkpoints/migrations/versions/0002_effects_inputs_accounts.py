"""effects, inputs, accounts, card expiry, dead letter replays

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('effects',
    sa.Column('request_key', sa.String(length=255), nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('result', sa.Text(), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('created_at_ms', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('request_key')
    )
    with op.batch_alter_table('effects', schema=None) as batch_op:
        batch_op.create_index('ix_effects_run', ['run_id'], unique=False)

    op.create_table('run_inputs',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('turn', sa.Integer(), nullable=False),
    sa.Column('tool_call_id', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('question', sa.Text(), nullable=False),
    sa.Column('reply', sa.Text(), nullable=True),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('asked_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('replied_at_ms', sa.BigInteger(), nullable=True),
    sa.Column('replied_by', sa.String(length=128), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'tool_call_id', name='uq_run_inputs_call')
    )
    op.create_table('user_accounts',
    sa.Column('user_id', sa.String(length=128), nullable=False),
    sa.Column('balance_credits', sa.BigInteger(), nullable=False),
    sa.Column('held_credits', sa.BigInteger(), nullable=False),
    sa.Column('updated_at_ms', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('user_id')
    )
    with op.batch_alter_table('cart_cards', schema=None) as batch_op:
        batch_op.add_column(sa.Column('user_id', sa.String(length=128), server_default='', nullable=False))
        batch_op.add_column(sa.Column('expires_at_ms', sa.BigInteger(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('confirmed_at_ms', sa.BigInteger(), nullable=True))

    with op.batch_alter_table('dead_letters', schema=None) as batch_op:
        batch_op.add_column(sa.Column('replayed_at_ms', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('replayed_by', sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column('replays', sa.Integer(), server_default='0', nullable=False))

    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.add_column(sa.Column('user_id', sa.String(length=128), server_default='', nullable=False))



def downgrade() -> None:
    with op.batch_alter_table('orders', schema=None) as batch_op:
        batch_op.drop_column('user_id')

    with op.batch_alter_table('dead_letters', schema=None) as batch_op:
        batch_op.drop_column('replays')
        batch_op.drop_column('replayed_by')
        batch_op.drop_column('replayed_at_ms')

    with op.batch_alter_table('cart_cards', schema=None) as batch_op:
        batch_op.drop_column('confirmed_at_ms')
        batch_op.drop_column('expires_at_ms')
        batch_op.drop_column('user_id')

    op.drop_table('user_accounts')
    op.drop_table('run_inputs')
    with op.batch_alter_table('effects', schema=None) as batch_op:
        batch_op.drop_index('ix_effects_run')

    op.drop_table('effects')
