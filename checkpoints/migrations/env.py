"""Alembic environment: runs on the connection checkpoints.db.migrate hands over (or the configured URL)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from checkpoints.schema import metadata

config = context.config
connection = config.attributes.get("connection")


def _run(conn: sa.engine.Connection) -> None:
    context.configure(connection=conn, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if connection is not None:
    _run(connection)
else:
    engine = sa.create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as conn:
        _run(conn)
