"""initial schema

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('cart_cards',
    sa.Column('card_id', sa.String(length=64), nullable=False),
    sa.Column('request_key', sa.String(length=255), nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('operation_id', sa.String(length=64), nullable=False),
    sa.Column('items', sa.Text(), nullable=False),
    sa.Column('total_cents', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('created_at_ms', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('card_id'),
    sa.UniqueConstraint('operation_id'),
    sa.UniqueConstraint('request_key')
    )
    with op.batch_alter_table('cart_cards', schema=None) as batch_op:
        batch_op.create_index('ix_cart_cards_run', ['run_id'], unique=False)

    op.create_table('dead_letters',
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('attempts', sa.Text(), nullable=False),
    sa.Column('observations', sa.Text(), nullable=True),
    sa.Column('at_ms', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('run_id')
    )
    op.create_table('orders',
    sa.Column('order_id', sa.String(length=64), nullable=False),
    sa.Column('operation_id', sa.String(length=64), nullable=False),
    sa.Column('card_id', sa.String(length=64), nullable=False),
    sa.Column('created_at_ms', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('order_id'),
    sa.UniqueConstraint('operation_id')
    )
    op.create_table('run_attempts',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('worker', sa.String(length=160), nullable=False),
    sa.Column('started_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('ended_at_ms', sa.BigInteger(), nullable=True),
    sa.Column('outcome', sa.String(length=32), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('run_attempts', schema=None) as batch_op:
        batch_op.create_index('ix_run_attempts_run', ['run_id', 'epoch'], unique=False)

    op.create_table('run_checkpoints',
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('user_id', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('query', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('owner', sa.String(length=160), nullable=True),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('phase', sa.String(length=16), nullable=False),
    sa.Column('checkpoint', sa.LargeBinary(length=16777216), nullable=True),
    sa.Column('prompt_tokens', sa.BigInteger(), nullable=False),
    sa.Column('completion_tokens', sa.BigInteger(), nullable=False),
    sa.Column('model_calls', sa.Integer(), nullable=False),
    sa.Column('last_event_id', sa.String(length=64), nullable=False),
    sa.Column('deliveries', sa.Integer(), nullable=False),
    sa.Column('total_deliveries', sa.Integer(), nullable=False),
    sa.Column('answer', sa.Text(), nullable=True),
    sa.Column('error_class', sa.String(length=16), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('updated_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('finished_at_ms', sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint('run_id')
    )
    with op.batch_alter_table('run_checkpoints', schema=None) as batch_op:
        batch_op.create_index('ix_run_checkpoints_state_updated', ['state', 'updated_at_ms'], unique=False)
        batch_op.create_index('ix_run_checkpoints_user', ['user_id'], unique=False)

    op.create_table('run_holds',
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('user_id', sa.String(length=128), nullable=False),
    sa.Column('credits_held', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('credits_charged', sa.Integer(), nullable=True),
    sa.Column('created_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('expires_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('closed_at_ms', sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint('run_id')
    )
    with op.batch_alter_table('run_holds', schema=None) as batch_op:
        batch_op.create_index('ix_run_holds_state_expires', ['state', 'expires_at_ms'], unique=False)

    op.create_table('run_ledger',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('at_ms', sa.BigInteger(), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('actor', sa.String(length=160), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('run_ledger', schema=None) as batch_op:
        batch_op.create_index('ix_run_ledger_run', ['run_id', 'id'], unique=False)

    op.create_table('run_steps',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('phase', sa.String(length=16), nullable=False),
    sa.Column('owner', sa.String(length=160), nullable=True),
    sa.Column('prompt_tokens', sa.BigInteger(), nullable=False),
    sa.Column('completion_tokens', sa.BigInteger(), nullable=False),
    sa.Column('checkpoint', sa.LargeBinary(length=16777216), nullable=True),
    sa.Column('at_ms', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('run_steps', schema=None) as batch_op:
        batch_op.create_index('ix_run_steps_run', ['run_id', 'step'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('run_steps', schema=None) as batch_op:
        batch_op.drop_index('ix_run_steps_run')

    op.drop_table('run_steps')
    with op.batch_alter_table('run_ledger', schema=None) as batch_op:
        batch_op.drop_index('ix_run_ledger_run')

    op.drop_table('run_ledger')
    with op.batch_alter_table('run_holds', schema=None) as batch_op:
        batch_op.drop_index('ix_run_holds_state_expires')

    op.drop_table('run_holds')
    with op.batch_alter_table('run_checkpoints', schema=None) as batch_op:
        batch_op.drop_index('ix_run_checkpoints_user')
        batch_op.drop_index('ix_run_checkpoints_state_updated')

    op.drop_table('run_checkpoints')
    with op.batch_alter_table('run_attempts', schema=None) as batch_op:
        batch_op.drop_index('ix_run_attempts_run')

    op.drop_table('run_attempts')
    op.drop_table('orders')
    op.drop_table('dead_letters')
    with op.batch_alter_table('cart_cards', schema=None) as batch_op:
        batch_op.drop_index('ix_cart_cards_run')

    op.drop_table('cart_cards')
