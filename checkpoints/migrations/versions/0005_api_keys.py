"""API keys for the HTTP front door: api_keys (the SHA-256 digest of each key, its user, admin or not)

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from checkpoints.schema import Ident

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'api_keys',
        sa.Column('key_hash', sa.String(64), primary_key=True),
        sa.Column('user_id', Ident(128), nullable=False),
        sa.Column('admin', sa.Boolean, nullable=False),
        sa.Column('created_at_ms', sa.BigInteger, nullable=False),
        sa.Column('revoked_at_ms', sa.BigInteger),
    )
    op.create_index('ix_api_keys_user', 'api_keys', ['user_id'])


def downgrade() -> None:
    op.drop_index('ix_api_keys_user', table_name='api_keys')
    op.drop_table('api_keys')
