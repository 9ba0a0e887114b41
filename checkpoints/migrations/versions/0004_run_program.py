"""each run names the program that runs it: run_checkpoints.agent and agent_version

Revision ID: 0004
Revises: 0003

Runs from before this revision were all the built-in shopping agent: they get `shopping` and an empty
version (an empty version is never refused on replay).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('run_checkpoints') as batch:
        batch.add_column(sa.Column('agent', sa.String(128), nullable=False, server_default='shopping'))
        batch.add_column(sa.Column('agent_version', sa.String(32), nullable=False, server_default=''))


def downgrade() -> None:
    with op.batch_alter_table('run_checkpoints') as batch:
        batch.drop_column('agent_version')
        batch.drop_column('agent')
