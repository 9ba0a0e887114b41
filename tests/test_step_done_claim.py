"""Checkpoint B with the inline claim of the next step in one transaction (issue 17): it writes what
checkpoint B followed by a claim of the next step would, its claim (planned from what B writes, not read
back) is the row as that claim would have read it, a holder fenced out writes nothing, and a transaction
retried after its first commit landed returns the claim it made. On both stores both the one-round-trip
statement (segments a write seals included) and the SQLAlchemy path are checked."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import examples.shopping  # noqa: F401 - registers the demo agent the deliveries run
from checkpoints import history, ledger, lifecycle, runs
from checkpoints.db import get_engine, transaction
from checkpoints.runs import Claim, Usage
from checkpoints.schema import run_attempts, run_steps
from fenced_core.errors import FencedOut
from harness.verdict import check_run
from tasks import submit_run
from tasks.delivery import deliver
from tests.conftest import MYSQL_URL, use_db, wipe_tables

QUERY = "wireless headphones under $100"


@pytest.fixture(params=["mysql-one_trip", "mysql-sqlalchemy", "sqlite-one_trip", "sqlite-sqlalchemy"])
def path(request: pytest.FixtureRequest, tmp_path: Path, redis_client: object,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Which transaction runs: the one-round-trip statement (on SQLite run statement by statement,
    checkpoints.sqlite_multi), or the SQLAlchemy one, on both stores."""
    store, path = request.param.split("-")
    use_db(MYSQL_URL if store == "mysql" else f"sqlite:///{tmp_path / 'store.db'}")
    wipe_tables()
    if path == "sqlalchemy":
        monkeypatch.setattr(runs, "one_trip", lambda: False)
    yield path
    use_db(MYSQL_URL)


def _step_zero_decided(user: str) -> tuple[Claim, dict[str, Any], Usage]:
    """A run claimed at step 0 with checkpoint A written: what checkpoint B of step 0 stores next."""
    run_id = submit_run(user, QUERY)
    c = runs.claim(run_id, "host:1:x/deliv")
    assert c is not None
    usage = Usage(120, 30, 1)
    runs.write_decided(c, 0, {"history": [], "decision": {"name": "search"}}, usage, "e-3")
    return c, {"history": [{"step": 0, "name": "search", "results": {"c1": ["kb-1"]}}]}, usage


def _attempts(run_id: str) -> list[tuple[int, int, str | None]]:
    with transaction(readonly=True) as conn:
        return [(r.step, r.epoch, r.outcome) for r in conn.execute(
            sa.select(run_attempts).where(run_attempts.c.run_id == run_id).order_by(run_attempts.c.id))]


def _step_rows(run_id: str) -> list[tuple[int, int, str]]:
    with transaction(readonly=True) as conn:
        return [(r.step, r.epoch, r.phase) for r in conn.execute(
            sa.select(run_steps).where(run_steps.c.run_id == run_id).order_by(run_steps.c.id))]


def test_it_writes_checkpoint_b_and_the_claim_and_its_claim_is_the_row_as_read(path):
    c, checkpoint, usage = _step_zero_decided(f"u-b-{path}")
    run_id = c.run.run_id
    nxt = runs.write_step_done_and_claim(c, 0, checkpoint, usage, "e-5")
    row = runs.get_run(run_id)
    assert row is not None
    assert (row.step, row.phase, row.state, row.epoch, row.owner) == (1, "done", "running", 2, c.token)
    assert (row.deliveries, row.total_deliveries, row.last_event_id) == (1, 2, "e-5")
    assert row.checkpoint == checkpoint and (row.prompt_tokens, row.model_calls) == (120, 1)
    assert _attempts(run_id) == [(0, 1, "step_done"), (1, 2, None)]
    assert _step_rows(run_id) == [(0, 1, "decided"), (0, 1, "done")]
    [entry] = [e for e in ledger.history(run_id) if e.epoch == 2]
    assert (entry.kind, entry.actor, entry.detail.get("inline")) == ("claimed", c.token, True)
    assert entry.reason == ("step 1 claimed, after checkpoint B of step 0 (phase done): step 1 starts with its model "
                            "call (inline: the delivery that ran step 0 went on)")
    # The claim: this delivery's, at epoch 2, its attempt the open one; its run is the row as the claim's
    # locked read would have returned it after checkpoint B (epoch 1, no owner, no delivery yet).
    assert (nxt.epoch, nxt.token, nxt.takeover, nxt.previous_owner, nxt.deliveries) == (2, c.token, False, None, 1)
    with transaction(readonly=True) as conn:
        open_attempt = conn.execute(sa.select(run_attempts.c.id).where(
            run_attempts.c.run_id == run_id, run_attempts.c.epoch == 2)).scalar_one()
    assert nxt.attempt_id == open_attempt and nxt.total_deliveries == row.total_deliveries
    # The next step's writes reuse the history entries this delivery encoded (checkpoints.history.EntryBytes).
    assert nxt.entry_bytes is c.entry_bytes
    as_read = dataclasses.replace(row, epoch=1, owner=None, deliveries=0, total_deliveries=1)
    assert dataclasses.asdict(nxt.run) == dataclasses.asdict(as_read)


def test_a_holder_fenced_out_writes_nothing(path):
    c, checkpoint, usage = _step_zero_decided(f"u-fenced-{path}")
    run_id = c.run.run_id
    lifecycle.cancel(run_id, "ops")  # a claim of its own: epoch 2
    before = (runs.get_run(run_id), _attempts(run_id), _step_rows(run_id), len(ledger.history(run_id)))
    with pytest.raises(FencedOut):
        runs.write_step_done_and_claim(c, 0, checkpoint, usage, "e-5")
    assert (runs.get_run(run_id), _attempts(run_id), _step_rows(run_id), len(ledger.history(run_id))) == before


@pytest.mark.parametrize("seals", [False, True])
def test_a_retry_after_the_first_commit_landed_returns_the_claim_it_made(path, monkeypatch, seals):
    """The commit landed but its reply was lost (the connection dropped): db_retry runs the transaction
    again, its fenced UPDATE matches nothing (the epoch moved on: ours), and it finds its own attempt. A
    segment the write sealed is the first commit's, stored once."""
    c, checkpoint, usage = _step_zero_decided(f"u-retry-{path}-{seals}")
    if seals:
        checkpoint = _sixteen()
    run_id = c.run.run_id
    calls: list[int] = []
    if path == "one_trip":  # the statement ends in its COMMIT: the reply is lost after it
        real = runs._step_done_and_claim_raw

        def commit_then_lose_the_reply(*args: Any) -> int:
            calls.append(real(*args))
            if len(calls) == 1:
                # The driver's own error, as a dropped connection raises it (PyMySQL or mysqlclient).
                raise get_engine().dialect.dbapi.OperationalError(2013, "Lost connection to MySQL server during query")
            return calls[-1]

        monkeypatch.setattr(runs, "_step_done_and_claim_raw", commit_then_lose_the_reply)
    else:  # SQLAlchemy commits after the function returns: the whole transaction runs again, as db_retry would
        real_in_txn = runs.in_txn

        def twice(fn: Any, *args: Any) -> Any:
            if fn is runs._step_done_and_claim_txn:
                calls.append(real_in_txn(fn, *args))
            calls.append(real_in_txn(fn, *args))
            return calls[-1]

        monkeypatch.setattr(runs, "in_txn", twice)
    nxt = runs.write_step_done_and_claim(c, 0, checkpoint, usage, "e-5")
    assert len(calls) == 2 and calls[0] == calls[1] == nxt.attempt_id, "the retry found the claim it made"
    assert _attempts(run_id) == [(0, 1, "step_done"), (1, 2, None)], "written once"
    assert _step_rows(run_id) == [(0, 1, "decided"), (0, 1, "done")]
    assert [e.epoch for e in ledger.history(run_id)].count(2) == 1
    assert _segments(run_id) == ([(0, [f"s{i}" for i in range(16)])] if seals else [])


def test_a_retry_that_finds_another_holders_claim_is_fenced_out(path):
    """Matched nothing and no attempt of this token at the next epoch: another holder owns the run."""
    c, checkpoint, usage = _step_zero_decided(f"u-other-{path}")
    assert runs.claim(c.run.run_id, "host:2:y/other") is not None  # a takeover: epoch 2, another token
    with pytest.raises(FencedOut):
        runs.write_step_done_and_claim(c, 0, checkpoint, usage, "e-5")
    assert _attempts(c.run.run_id) == [(0, 1, None), (0, 2, None)]


def test_a_long_run_inline_seals_its_segments_and_ends_with_its_whole_history(path):
    """40 steps in deliveries of up to 9 steps each: the combined write seals segments (the SQLAlchemy
    path, on MariaDB too) and the next claim carries the whole history."""
    from bench import steps_agent

    run_id = submit_run("u-long", steps_agent.query(40), agent=steps_agent.NAME)
    step: int | None = None
    sent: list[int] = []
    deliveries = 0
    while (outcome := deliver(run_id, step, lambda _r, s: sent.append(s), inline=8)) == "continue":
        deliveries += 1
        step = sent[-1]
    assert outcome == "done" and deliveries == 4, "40 steps, 9 per delivery"
    run = runs.get_run(run_id)
    assert run is not None and [h["name"] for h in run.checkpoint["history"]] == [f"s{i}" for i in range(40)]
    assert history.sealed_of(run.checkpoint) == 32
    claims = [e for e in ledger.history(run_id) if e.kind == "claimed"]
    assert [e.epoch for e in claims] == list(range(1, 41))
    assert sum(bool(e.detail.get("inline")) for e in claims) == 40 - 5
    assert check_run(run_id).ok, check_run(run_id).failed
    assert runs.one_trip() == (path == "one_trip")


def _sixteen() -> dict[str, Any]:
    """A checkpoint whose history fills the first segment: writing it seals segment 0."""
    return {"history": [{"step": i, "name": f"s{i}", "results": {"c": [i] * 3}} for i in range(16)]}


def _segments(run_id: str) -> list[tuple[int, list[str]]]:
    from checkpoints import codec
    from checkpoints.schema import run_history

    with transaction(readonly=True) as conn:
        return [(r.seq, [e["name"] for e in codec.decode(r.body)["entries"]]) for r in conn.execute(
            sa.select(run_history).where(run_history.c.run_id == run_id).order_by(run_history.c.seq))]


@pytest.mark.parametrize("write", ["checkpoint_b", "checkpoint_b_and_claim", "terminal"])
def test_a_write_that_seals_a_segment_stores_it_with_its_checkpoint_or_not_at_all(path, write, monkeypatch):
    """On MariaDB the segment goes in the checkpoint's own one-round-trip query, conditional on its fence;
    a holder fenced out stores none. (The SQLAlchemy path writes it after its fenced UPDATE succeeded.)"""
    def do(c: Claim, usage: Usage) -> None:
        if write == "checkpoint_b":
            runs.write_step_done(c, 0, _sixteen(), usage, "e-5")
        elif write == "checkpoint_b_and_claim":
            runs.write_step_done_and_claim(c, 0, _sixteen(), usage, "e-5")
        else:
            runs.finish(c, "done", _sixteen(), usage, "e-5", answer="ok")

    if path == "one_trip":  # nothing of these writes may go the multi-round-trip way
        monkeypatch.setattr(runs, "in_txn", lambda *a, **k: pytest.fail("a sealing write left the one-trip path"))
    fenced, usage = _step_zero_decided(f"u-seal-out-{path}-{write}")[0::2]
    lifecycle.cancel(fenced.run.run_id, "ops")  # its epoch moves on
    with pytest.raises(FencedOut):
        do(fenced, usage)
    assert _segments(fenced.run.run_id) == [], "a holder fenced out sealed a segment"

    c, usage = _step_zero_decided(f"u-seal-{path}-{write}")[0::2]
    do(c, usage)
    assert _segments(c.run.run_id) == [(0, [f"s{i}" for i in range(16)])]
    run = runs.get_run(c.run.run_id)
    assert run is not None and history.sealed_of(run.checkpoint) == 16
    assert [h["name"] for h in run.checkpoint["history"]] == [f"s{i}" for i in range(16)]
    assert c.run.checkpoint[history.SEALED] == 16, "the claim knows what is sealed for its next write"
