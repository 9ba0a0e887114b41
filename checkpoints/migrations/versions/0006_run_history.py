"""run_history: a run's history in sealed segments, so each checkpoint write stays bounded (issue 17)

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from checkpoints.schema import Blob, Ident

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'run_history',
        sa.Column('run_id', Ident(64), primary_key=True),
        sa.Column('seq', sa.Integer, primary_key=True),
        sa.Column('body', Blob, nullable=False),
    )


def downgrade() -> None:
    op.drop_table('run_history')
