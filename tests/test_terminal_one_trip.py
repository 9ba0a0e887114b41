"""The terminal transaction in two round trips on MariaDB (issue 17), and the same queries on SQLite (run
statement by statement: checkpoints.sqlite_multi), write exactly what the SQLAlchemy path writes: the
same run row, hold, account, ledger entries and attempt, in every settlement case (settled, the hold
already closed, an account that does not carry the hold, no hold, a reopened hold) and nothing at all
when the holder was fenced out."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pymysql.connections
import pytest
import sqlalchemy as sa

from checkpoints import codec, ledger, lifecycle, runs
from checkpoints.db import get_engine, in_txn, transaction
from checkpoints.runs import Claim, Usage
from checkpoints.schema import run_attempts, run_checkpoints, run_holds, user_accounts
from fenced_core.errors import FencedOut
from tasks.control import replay_dead_letter


def _new_claim(user: str) -> Claim:
    run_id = runs.new_run_id()
    in_txn(runs.create_run_txn, run_id, user, "normal", "buy headphones", "test")
    c = runs.claim(run_id, "w/1")
    assert c is not None
    return c


def _set_hold(c: Claim, **values: Any) -> None:
    with transaction() as conn:
        conn.execute(run_holds.update().where(run_holds.c.run_id == c.run.run_id).values(**values))


def _plain(user: str) -> Claim:
    return _new_claim(user)


def _hold_closed(user: str) -> Claim:
    c = _new_claim(user)
    _set_hold(c, state="released", credits_charged=0, closed_at_ms=1)
    return c


def _no_account(user: str) -> Claim:
    c = _new_claim(user)
    with transaction() as conn:
        conn.execute(user_accounts.delete().where(user_accounts.c.user_id == user))
    return c


def _no_hold(user: str) -> Claim:
    c = _new_claim(user)
    with transaction() as conn:
        conn.execute(run_holds.delete().where(run_holds.c.run_id == c.run.run_id))
    return c


def _reopened(user: str) -> Claim:
    c = _new_claim(user)
    runs.write_decided(c, 0, {"decision": {}}, Usage(2400, 800, 1), "")
    runs.dead_letter(c, "poison", {})
    in_txn(lifecycle.close_stale_holds_txn, runs.now_ms() + 10**9, "sweeper")
    replay_dead_letter(c.run.run_id, "ops")
    again = runs.claim(c.run.run_id, "w/2")
    assert again is not None
    return again


def _taken_over(user: str) -> Claim:
    c = _new_claim(user)
    assert runs.claim(c.run.run_id, "w/2") is not None  # a newer holder: c is fenced out
    return c


SCENARIOS: dict[str, Callable[[str], Claim]] = {
    "settled": _plain, "hold already closed": _hold_closed, "account without the hold": _no_account,
    "no hold": _no_hold, "reopened hold": _reopened, "fenced out": _taken_over,
}
ENDINGS = {"done": {"answer": "the answer"}, "failed": {"error_class": "terminal", "error": "tool broke"}}


@contextmanager
def _queries() -> Iterator[list[str]]:
    """The queries this process sends to MariaDB, through whichever driver the test store's URL names
    (PyMySQL, or mysqlclient in the suite's mysqlclient lane: scripts/test.sh)."""
    sent: list[str] = []
    if get_engine().dialect.driver == "mysqldb":
        import MySQLdb.connections

        cls: Any = MySQLdb.connections.Connection
    else:
        cls = pymysql.connections.Connection
    query = cls.query

    def counted(self: Any, sql: Any, *args: Any) -> Any:
        sent.append(sql.decode(errors="replace") if isinstance(sql, (bytes, bytearray)) else str(sql))
        return query(self, sql, *args)

    cls.query = counted
    try:
        yield sent
    finally:
        cls.query = query


def _snapshot(c: Claim, user: str, outcome: Any) -> dict[str, Any]:
    run_id = c.run.run_id

    def same(text: Any) -> Any:
        return text.replace(run_id, "<run>").replace(user, "<user>") if isinstance(text, str) else text

    with transaction(readonly=True) as conn:
        row = conn.execute(sa.select(run_checkpoints).where(run_checkpoints.c.run_id == run_id)).mappings().one()
        hold = conn.execute(sa.select(run_holds).where(run_holds.c.run_id == run_id)).mappings().first()
        account = conn.execute(sa.select(user_accounts.c.balance_credits, user_accounts.c.held_credits)
                               .where(user_accounts.c.user_id == user)).first()
        attempt = conn.execute(sa.select(run_attempts).where(run_attempts.c.id == c.attempt_id)).mappings().one()
    return {
        "outcome": outcome,
        "run": {**{k: row[k] for k in ("state", "phase", "owner", "epoch", "answer", "error_class", "error",
                                       "last_event_id", "prompt_tokens", "completion_tokens")},
                "checkpoint": codec.decode(row["checkpoint"]), "finished": row["finished_at_ms"] is not None},
        "hold": None if hold is None else {
            **{k: hold[k] for k in ("state", "credits_held", "credits_charged", "credits_charged_before",
                                    "tokens_settled_before")},
            "closed_with_the_run": hold["closed_at_ms"] == row["finished_at_ms"] and hold["closed_at_ms"] is not None},
        "account": None if account is None else tuple(account),
        "ledger": [(e.epoch, e.actor, e.kind, same(e.reason), {k: same(v) for k, v in e.detail.items()})
                   for e in ledger.history(run_id)],
        "attempt": (attempt["outcome"], attempt["error"], attempt["ended_at_ms"] is not None),
    }


def _finish(scenario: str, ending: str, path: str, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], list[str]]:
    user = f"{scenario}/{ending}/{path}"
    c = SCENARIOS[scenario](user)
    with monkeypatch.context() as m:
        if path == "sqlalchemy":
            m.setattr(runs, "one_trip", lambda url=None: False)
        with _queries() as sent:
            try:
                outcome: Any = runs.finish(c, ending, {"history": [{"step": 0}]}, Usage(3000, 1000, 2), "9-0",
                                           **ENDINGS[ending])
            except FencedOut:
                outcome = "FencedOut"
    return _snapshot(c, user, outcome), sent


@pytest.mark.parametrize("ending", sorted(ENDINGS))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_on_either_store_the_one_trip_terminal_write_is_the_sqlalchemy_one(store, monkeypatch, scenario, ending):
    """SQLite runs the same one-trip queries statement by statement (checkpoints.sqlite_multi); on both
    stores they write what the SQLAlchemy path writes."""
    expected = _finish(scenario, ending, "sqlalchemy", monkeypatch)[0]
    assert runs.one_trip(), f"{store}: the hot path is the one-trip one"
    assert _finish(scenario, ending, "one trip", monkeypatch)[0] == expected
    if scenario == "fenced out":
        assert expected["outcome"] == "FencedOut"
    else:
        assert expected["run"]["state"] == ending


@pytest.mark.parametrize("ending", sorted(ENDINGS))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_one_trip_terminal_write_is_the_sqlalchemy_one(mysql_store, monkeypatch, scenario, ending):
    expected, sa_sent = _finish(scenario, ending, "sqlalchemy", monkeypatch)
    got, sent = _finish(scenario, ending, "one trip", monkeypatch)
    assert got == expected
    if scenario == "fenced out":
        assert expected["outcome"] == "FencedOut" and expected["ledger"][-1][2] == "takeover", "nothing written"
        assert len(sent) == 1, f"the fenced UPDATE only (then the rollback): {sent}"
    else:
        assert expected["run"]["state"] == ending
        assert len(sent) == 2, f"two round trips, the last ending in COMMIT: {sent}"
        assert sent[-1].endswith("COMMIT")
        assert len(sa_sent) > len(sent), "the SQLAlchemy path is the many-statement one it is compared with"
