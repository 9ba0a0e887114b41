"""Which runs occupy an admission slot: the database's side of the sweeper's slot reconciliation.

Read only. A run holds a slot while its row is queued, running or waiting (`OCCUPYING_STATES`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import sqlalchemy as sa

from checkpoints.db import transaction
from checkpoints.schema import run_checkpoints

OCCUPYING_STATES = ("queued", "running", "waiting")

_rc = run_checkpoints.c


def occupying_pages(page: int = 500) -> Iterator[list[tuple[str, str]]]:
    """Every run that holds a slot, as pages of (run_id, user_id), one short read each.

    Keyset pages per state over (state, updated_at_ms, run_id) (the state index), so a page costs
    O(page) however many rows the table holds. A row that changes state mid-scan may be missed or
    seen twice; the next sweep sees it."""
    for state in OCCUPYING_STATES:
        after: tuple[int, str] | None = None
        while True:
            q = (sa.select(_rc.run_id, _rc.user_id, _rc.updated_at_ms).where(_rc.state == state)
                 .order_by(_rc.updated_at_ms, _rc.run_id).limit(page))
            if after is not None:
                q = q.where(sa.or_(_rc.updated_at_ms > after[0],
                                   sa.and_(_rc.updated_at_ms == after[0], _rc.run_id > after[1])))
            with transaction(readonly=True) as conn:
                rows = conn.execute(q).all()
            if rows:
                yield [(r.run_id, r.user_id) for r in rows]
            if len(rows) < page:
                break
            after = (rows[-1].updated_at_ms, rows[-1].run_id)


def states(run_ids: Sequence[str]) -> dict[str, str]:
    """run_id -> state for the ids that have a row (one read; callers pass a page at a time)."""
    if not run_ids:
        return {}
    with transaction(readonly=True) as conn:
        rows = conn.execute(sa.select(_rc.run_id, _rc.state).where(_rc.run_id.in_(list(run_ids)))).all()
    return {r.run_id: r.state for r in rows}
