"""SQLite runs the hot path's one-query transactions statement by statement (checkpoints.sqlite_multi):
the fence's count is the rows the UPDATE matched, later statements are conditional on it, a statement
that fails leaves nothing of the transaction written, and a query it cannot translate is refused.
On a real SQLite store (WAL), through checkpoints.db.raw_txn as the hot path uses it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from checkpoints import runs
from checkpoints.db import in_txn, raw_txn, results, transaction
from checkpoints.schema import run_attempts, run_checkpoints
from checkpoints.sqlite_multi import MultiCursor
from tests.conftest import MYSQL_URL, use_db

# A fenced update with a conditional insert after it, as checkpoints.runs writes them.
FENCED = ("UPDATE run_checkpoints SET updated_at_ms = %s WHERE run_id = %s AND epoch = %s; "
          "SET @fenced = ROW_COUNT(); "
          "INSERT INTO run_attempts (run_id, step, epoch, worker, started_at_ms) "
          "SELECT %s, 0, %s, %s, 1 FROM DUAL WHERE @fenced = 1; "
          "SELECT epoch, updated_at_ms FROM run_checkpoints WHERE run_id = %s FOR UPDATE; COMMIT")


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[str]:
    use_db(f"sqlite:///{tmp_path / 'store.db'}")
    run_id = runs.new_run_id()
    in_txn(runs.create_run_txn, run_id, "u1", "normal", "headphones", "test")
    yield run_id
    use_db(MYSQL_URL)


def _row(run_id: str) -> tuple[int, int]:
    with transaction(readonly=True) as conn:
        row = conn.execute(sa.select(run_checkpoints.c.epoch, run_checkpoints.c.updated_at_ms)
                           .where(run_checkpoints.c.run_id == run_id)).one()
    return int(row[0]), int(row[1])


def _attempts(run_id: str) -> list[str]:
    with transaction(readonly=True) as conn:
        return [r.worker for r in conn.execute(sa.select(run_attempts).where(run_attempts.c.run_id == run_id))]


def test_statements_after_the_fence_are_conditional_on_the_rows_it_matched(sqlite_store):
    run_id = sqlite_store
    epoch, updated = _row(run_id)
    with raw_txn() as cur:
        assert isinstance(cur, MultiCursor)
        cur.execute(FENCED, (updated, run_id, epoch, run_id, epoch, "same-values", run_id))
        out = results(cur)
    # Matched, though the UPDATE changed no value: the count is of matched rows (MySQL's FOUND_ROWS).
    assert [r[0] for r in out[:3]] == [1, 0, 1] and len(out) == 5
    assert out[3][2] == [(epoch, updated)], "the SELECT's rows are its result's"
    with raw_txn() as cur:
        cur.execute(FENCED, (99, run_id, epoch + 1, run_id, epoch + 1, "stale-epoch", run_id))
        out = results(cur)
    assert [r[0] for r in out[:3]] == [0, 0, 0], "fenced out: the insert matched nothing"
    assert _attempts(run_id) == ["same-values"] and _row(run_id) == (epoch, updated)


def test_a_statement_that_fails_leaves_nothing_of_the_transaction(sqlite_store):
    run_id = sqlite_store
    epoch, _ = _row(run_id)
    failing = FENCED.replace("SELECT %s, 0,", "SELECT %s, NULL,")  # run_attempts.step is NOT NULL
    with pytest.raises(sa.exc.IntegrityError), raw_txn() as cur:
        cur.execute(failing, (777, run_id, epoch, run_id, epoch, "w", run_id))
    assert _row(run_id)[1] != 777, "the fenced UPDATE before the failure was rolled back"
    assert _attempts(run_id) == []
    with raw_txn() as cur:  # the connection went back to the pool usable, outside any transaction
        cur.execute(FENCED, (778, run_id, epoch, run_id, epoch, "after", run_id))
    assert _row(run_id)[1] == 778 and _attempts(run_id) == ["after"]


def test_a_query_it_cannot_translate_or_miscounted_parameters_are_refused(sqlite_store):
    run_id = sqlite_store
    with pytest.raises(ValueError, match="no SQLite translation"), raw_txn() as cur:
        cur.execute("INSERT INTO run_ledger (run_id) VALUES (%s); SELECT LAST_INSERT_ID(); COMMIT", (run_id,))
    with pytest.raises(ValueError, match="2 parameters for a query of 1 placeholders"), raw_txn() as cur:
        cur.execute("SELECT epoch FROM run_checkpoints WHERE run_id = %s; COMMIT", (run_id, "extra"))
    with pytest.raises(ValueError, match="used before this query sets it"), raw_txn() as cur:
        cur.execute("UPDATE run_checkpoints SET epoch = epoch WHERE run_id = %s AND @fenced = 1; COMMIT", (run_id,))
