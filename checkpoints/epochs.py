"""Read-only: the epochs of the runs the database calls in flight, for the start-up check that the
database's epochs never went back (tasks.epoch_check; docs/operations.md "After a database failover")."""

from __future__ import annotations

import sqlalchemy as sa

from checkpoints.db import transaction
from checkpoints.schema import run_checkpoints

# Not terminal: the runs a lost commit can leave behind a newer claim (a lost claim, checkpoint,
# cancel or terminal write reverts the row to an earlier, still unfinished version of itself).
IN_FLIGHT_STATES = ("queued", "running", "waiting")


def in_flight(limit: int) -> dict[str, int]:
    """run_id -> epoch of the `limit` most recently updated runs in IN_FLIGHT_STATES."""
    rc = run_checkpoints.c
    q = (sa.select(rc.run_id, rc.epoch).where(rc.state.in_(IN_FLIGHT_STATES))
         .order_by(rc.updated_at_ms.desc()).limit(limit))
    with transaction(readonly=True) as conn:
        return {r.run_id: int(r.epoch) for r in conn.execute(q)}


def epochs_of(run_ids: list[str]) -> dict[str, int]:
    """run_id -> epoch now, for these runs (a fresh read: the re-check of suspects)."""
    if not run_ids:
        return {}
    rc = run_checkpoints.c
    with transaction(readonly=True) as conn:
        return {r.run_id: int(r.epoch) for r in conn.execute(
            sa.select(rc.run_id, rc.epoch).where(rc.run_id.in_(run_ids)))}
