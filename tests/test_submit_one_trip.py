"""A submit's transaction in one round trip (checkpoints.create_one_trip) writes exactly what the
SQLAlchemy Core batch path (runs.create_runs_txn) writes for one run: the account, the hold, the run's
row and the ledger entry, row for row, on MariaDB and on SQLite; a refusal and a run id that exists
write nothing; and submit_run takes it, retrying a lost reply through the Core path without a second hold."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from checkpoints import create_one_trip, runs
from checkpoints.db import DatabaseUnavailable, in_txn, transaction
from checkpoints.schema import run_checkpoints, run_holds, run_ledger, user_accounts
from fenced_core.errors import InsufficientCredits
from tests.conftest import wipe_tables

NOW = 1_700_000_000_123
TABLES = (user_accounts, run_holds, run_checkpoints, run_ledger)
# Users and queries are data: brackets, quotes and non-ASCII go in and come out byte for byte.
USER = "[b]ü'ser[/b]"
QUERY = "[red]wireless[/red] headphones; DROP TABLE x; -- 'é'"


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "now_ms", lambda: NOW)
    monkeypatch.setattr(create_one_trip, "now_ms", lambda: NOW)


def _snapshot() -> dict[str, list[dict[str, Any]]]:
    out = {}
    with transaction(readonly=True) as conn:
        for table in TABLES:
            rows = [dict(r) for r in conn.execute(sa.select(table)).mappings().all()]
            for r in rows:
                r.pop("id", None)  # the ledger's autoincrement id
            out[table.name] = sorted(rows, key=repr)
    return out


def _reference(new: runs.NewRun) -> int | InsufficientCredits:
    def txn(conn: Any) -> int | InsufficientCredits:
        result = runs.create_runs_txn(conn, [new], "api", peek=False)[0]
        if isinstance(result, InsufficientCredits):
            raise result
        assert isinstance(result, int)
        return result

    return in_txn(txn)


def _known_user(credits_held: int) -> None:
    """The user has an account already, with `credits_held` of it held by another run."""
    held = runs.NewRun("run-earlier", USER, "normal", "earlier", "shopping")
    _reference(held)
    with transaction() as conn:
        conn.execute(user_accounts.update().where(user_accounts.c.user_id == USER).values(held_credits=credits_held))


def _both(prepare: Any, kind: str = "normal") -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    """The same submit through the reference and through the one-trip query, each on a store prepared
    the same way; (reference outcome, one-trip outcome, their table snapshots)."""
    outcomes, snapshots = [], []
    for create in (_reference, lambda n: create_one_trip.create_run(n, "api")):
        wipe_tables()
        prepare()
        new = runs.NewRun("run-0001", USER, kind, QUERY, "shopping", "v[1]")
        try:
            outcomes.append(create(new))
        except InsufficientCredits as exc:
            outcomes.append(("refused", exc.user_id, exc.needed, exc.available))
        snapshots.append(_snapshot())
    return outcomes[0], outcomes[1], snapshots[0], snapshots[1]


@pytest.mark.parametrize("case", ["new user", "known user", "known user refused", "new user refused"])
def test_the_one_trip_submit_writes_what_the_core_path_writes(store, frozen, settings_env, case):
    if case == "new user refused":
        settings_env(default_balance_credits=5)  # less than any hold
    prepare = {"new user": lambda: None, "new user refused": lambda: None,
               "known user": lambda: _known_user(40), "known user refused": lambda: _known_user(995)}[case]
    ref, got, ref_rows, got_rows = _both(prepare, kind="large" if case == "new user refused" else "normal")
    assert got == ref
    assert got_rows == ref_rows
    if "refused" in case:
        assert isinstance(got, tuple) and got[0] == "refused"
        assert not any(r["run_id"] == "run-0001" for r in got_rows["run_checkpoints"])
    else:
        assert isinstance(got, int) and got > 0
        [row] = [r for r in got_rows["run_checkpoints"] if r["run_id"] == "run-0001"]
        assert (row["user_id"], row["query"], row["agent_version"]) == (USER, QUERY, "v[1]")
    if case == "new user refused":
        assert got_rows["user_accounts"] == [], "a refused first submit leaves no account behind"


def test_a_run_id_that_exists_fails_and_writes_nothing(store, frozen):
    new = runs.NewRun("run-dup", USER, "normal", QUERY, "shopping")
    held = create_one_trip.create_run(new, "api")
    before = _snapshot()
    with pytest.raises(sa.exc.IntegrityError):
        create_one_trip.create_run(runs.NewRun("run-dup", USER, "normal", "another", "shopping"), "api")
    assert _snapshot() == before, "nothing of the refused transaction stays: not the hold, not the held credits"
    [account] = before["user_accounts"]
    assert account["held_credits"] == held


def test_submit_run_creates_the_run_in_one_round_trip(store, monkeypatch):
    from tasks import submit_run

    calls: list[str] = []
    real = create_one_trip.create_run

    def counting(new: runs.NewRun, actor: str) -> int:
        calls.append(new.run_id)
        return real(new, actor)

    monkeypatch.setattr(create_one_trip, "create_run", counting)
    run_id = submit_run(USER, QUERY)
    assert calls == [run_id]
    run = runs.peek_run(run_id)
    assert run is not None and (run.user_id, run.query, run.state) == (USER, QUERY, "queued")


def test_a_lost_reply_is_retried_through_the_core_path_and_holds_once(store, monkeypatch, redis_client):
    """The one-trip commit landed but its reply was lost (DatabaseUnavailable after the write): the retry
    finds the run, holds nothing twice, and submit_run returns the same run, with one wake-up."""
    from tasks import queues, submit_run

    real = create_one_trip.create_run

    def lost_reply(new: runs.NewRun, actor: str) -> int:
        real(new, actor)
        raise DatabaseUnavailable(sa.exc.OperationalError("COMMIT", {}, Exception("connection lost after commit")))

    monkeypatch.setattr(create_one_trip, "create_run", lost_reply)
    run_id = submit_run(USER, QUERY)
    with transaction(readonly=True) as conn:
        holds = conn.execute(sa.select(run_holds).where(run_holds.c.run_id == run_id)).mappings().all()
        account = conn.execute(sa.select(user_accounts).where(user_accounts.c.user_id == USER)).mappings().one()
        runs_of_user = conn.execute(sa.select(run_checkpoints.c.run_id)
                                    .where(run_checkpoints.c.user_id == USER)).scalars().all()
    assert runs_of_user == [run_id]
    assert len(holds) == 1 and account["held_credits"] == holds[0]["credits_held"]
    waiting = sum(int(redis_client.llen(q)) for q in (queues.NORMAL, queues.LARGE, queues.CONTINUE))
    assert waiting == 1, f"one wake-up for the run, saw {waiting}"
