"""The epochs of the runs the database calls in flight, for the start-up check that the database's epochs
never went back, and the repair after a failover that lost commits (tasks.epoch_check; docs/operations.md,
"After a database failover")."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from checkpoints import ledger
from checkpoints.db import in_txn
from checkpoints.schema import run_checkpoints

# Not terminal: the runs a lost commit can leave behind a newer claim (a lost claim, checkpoint,
# cancel or terminal write reverts the row to an earlier, still unfinished version of itself).
IN_FLIGHT_STATES = ("queued", "running", "waiting")


def in_flight(limit: int) -> dict[str, int]:
    """run_id -> epoch of the `limit` most recently updated runs in IN_FLIGHT_STATES (retried through a
    database outage like every transaction, within the process's retry window)."""
    rc = run_checkpoints.c
    q = (sa.select(rc.run_id, rc.epoch).where(rc.state.in_(IN_FLIGHT_STATES))
         .order_by(rc.updated_at_ms.desc()).limit(limit))
    return in_txn(lambda conn: {r.run_id: int(r.epoch) for r in conn.execute(q)})


def epochs_of(run_ids: list[str]) -> dict[str, int]:
    """run_id -> epoch now, for these runs (a fresh read: the re-check of suspects)."""
    if not run_ids:
        return {}
    rc = run_checkpoints.c
    q = sa.select(rc.run_id, rc.epoch).where(rc.run_id.in_(run_ids))
    return in_txn(lambda conn: {r.run_id: int(r.epoch) for r in conn.execute(q)})


def raise_behind_txn(conn: Connection, run_id: str, db_epoch: int, mirror: int, actor: str) -> int | None:
    """Raise an in-flight run's epoch from `db_epoch` (behind its Redis mirror) to `mirror + 1`, owner
    cleared, with a ledger entry: no holder from before the failover owns the epoch any more (the next
    claim takes `mirror + 2`). Conditional on the epoch still being `db_epoch` and the run in flight;
    returns the new epoch, or None if the row had moved on. The state is left as it was."""
    rc = run_checkpoints.c
    new = mirror + 1
    changed = conn.execute(run_checkpoints.update().where(
        rc.run_id == run_id, rc.epoch == db_epoch, rc.state.in_(IN_FLIGHT_STATES)).values(epoch=new, owner=None))
    if not changed.rowcount:
        return None
    ledger.record_txn(conn, run_id, new, actor, "epoch_repaired",
                      f"the database's epoch {db_epoch} was behind the Redis epoch mirror {mirror} (commits lost "
                      f"in a database failover or restore): raised to {new}, so no holder from before can write",
                      {"db_epoch": db_epoch, "mirror": mirror})
    return new


def raise_behind(run_id: str, db_epoch: int, mirror: int, actor: str) -> int | None:
    """raise_behind_txn in its own transaction."""
    return in_txn(raise_behind_txn, run_id, db_epoch, mirror, actor)
