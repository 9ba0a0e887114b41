"""A wake-up's claim in ONE query when the row is as the wake-up expects it (issue 17): the locked read and
the compare-and-set, guarded by everything the claim's plan reads, with its attempt row, its ledger entry
and the COMMIT. On both stores, in every case (the expected row, a takeover, a row with deliveries
counted, a row at checkpoint A, an owner with no delivery counted, a stale step or continuation, an
ended run, no run, a retry whose first commit landed), what it writes and returns is what the
SQLAlchemy claim writes and returns; a row not as expected costs one query more and is claimed by the
two-query claim."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from checkpoints import ledger, lifecycle, runs
from checkpoints.db import get_engine, in_txn, transaction
from checkpoints.runs import Claim, Run, Usage
from checkpoints.schema import run_attempts, run_checkpoints

TOKEN = "host:1:x/deliv"
QUERY = "wireless headphones under $100"


def _submitted(user: str) -> tuple[str, int]:
    run_id = runs.new_run_id()
    in_txn(runs.create_run_txn, run_id, user, "normal", QUERY, "test")
    return run_id, 0


def _after_checkpoint_b(user: str) -> tuple[str, int]:
    """Step 0 ran and handed over: the row at step 1, phase done, no owner, no delivery of it yet."""
    run_id, _ = _submitted(user)
    c = runs.claim(run_id, "host:9:w/prev")
    assert c is not None
    runs.write_decided(c, 0, {"history": [], "decision": {"name": "search"}}, Usage(10, 5, 1), "e-1")
    runs.write_step_done(c, 0, {"history": [{"step": 0, "name": "search"}]}, Usage(10, 5, 1), "e-2")
    return run_id, 1


def _held_by_another(user: str) -> tuple[str, int]:
    """Its holder died mid-step (owner set): the claim is a takeover."""
    run_id, step = _submitted(user)
    assert runs.claim(run_id, "host:9:w/dead") is not None
    return run_id, step


def _set(run_id: str, **values: Any) -> None:
    with transaction() as conn:
        conn.execute(run_checkpoints.update().where(run_checkpoints.c.run_id == run_id).values(**values))


def _deliveries_counted(user: str) -> tuple[str, int]:
    run_id, step = _after_checkpoint_b(user)
    _set(run_id, deliveries=2)
    return run_id, step


def _at_checkpoint_a(user: str) -> tuple[str, int]:
    run_id, step = _after_checkpoint_b(user)
    _set(run_id, phase="decided")
    return run_id, step


def _owned_without_a_delivery(user: str) -> tuple[str, int]:
    """An owner with no delivery counted (no write leaves this; the guard on the owner holds anyway)."""
    run_id, step = _after_checkpoint_b(user)
    _set(run_id, owner="host:9:w/odd")
    return run_id, step


def _stale_step(user: str) -> tuple[str, int]:
    run_id, _ = _submitted(user)
    return run_id, 1


def _stale_continuation(user: str) -> tuple[str, int]:
    """A continuation for step 1 delivered again after step 1 was done (the row at step 2, phase done)."""
    run_id, _ = _after_checkpoint_b(user)
    c = runs.claim(run_id, "host:9:w/next")
    assert c is not None
    runs.write_step_done(c, 1, {"history": [{"step": 0, "name": "search"}, {"step": 1, "name": "compare"}]},
                         Usage(20, 10, 2), "e-3")
    return run_id, 1


def _ended(user: str) -> tuple[str, int]:
    run_id, step = _submitted(user)
    lifecycle.cancel(run_id, "ops")
    return run_id, step


def _no_run(user: str) -> tuple[str, int]:
    return f"missing-{user}", 0


# name -> (setup, whether the one query claims it as expected)
SCENARIOS: dict[str, tuple[Callable[[str], tuple[str, int]], bool]] = {
    "first wake-up": (_submitted, True), "after checkpoint B": (_after_checkpoint_b, True),
    "takeover": (_held_by_another, False), "deliveries counted": (_deliveries_counted, False),
    "at checkpoint A": (_at_checkpoint_a, False), "owned without a delivery": (_owned_without_a_delivery, False),
    "stale step": (_stale_step, True), "stale continuation": (_stale_continuation, True), "ended": (_ended, True),
    "no run": (_no_run, True),
}


def _state(run_id: str, found: Claim | Run | None) -> dict[str, Any]:
    """What a claim returned and wrote, without the run id and the clock."""
    row = runs.get_run(run_id)
    with transaction(readonly=True) as conn:
        attempts = [(r.step, r.epoch, r.worker, r.outcome) for r in conn.execute(
            sa.select(run_attempts).where(run_attempts.c.run_id == run_id).order_by(run_attempts.c.id))]
    entries = [(e.epoch, e.actor, e.kind, e.reason, e.detail) for e in ledger.history(run_id)]
    returned: Any = found
    if isinstance(found, Claim):
        returned = (found.epoch, found.token, found.takeover, found.previous_owner, found.deliveries,
                    found.total_deliveries, _plain(found.run))
        with transaction(readonly=True) as conn:
            open_id = conn.execute(sa.select(run_attempts.c.id).where(
                run_attempts.c.run_id == run_id, run_attempts.c.epoch == found.epoch)).scalar_one()
        assert found.attempt_id == open_id, "the claim's attempt is the one it wrote"
    elif isinstance(found, Run):
        returned = _plain(found)
    return {"returned": returned, "row": _plain(row) if row else None, "attempts": attempts, "ledger": entries}


def _plain(run: Run) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(run).items()
            if k not in ("run_id", "created_at_ms", "updated_at_ms", "finished_at_ms")}


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The transactions a claim runs, by function name."""
    sent: list[str] = []
    real = runs.in_raw_txn

    def spy(fn: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(fn.__name__)
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(runs, "in_raw_txn", spy)
    return sent


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_one_query_claim_is_the_sqlalchemy_claim(store, monkeypatch, scenario):
    setup, as_expected = SCENARIOS[scenario]
    ref_run, step = setup(f"u-ref-{store}")
    with monkeypatch.context() as m:
        m.setattr(runs, "one_trip", lambda: False)
        reference = _state(ref_run, runs.claim_or_row(ref_run, TOKEN, step))
    run_id, step = setup(f"u-one-{store}")
    sent = _spy(monkeypatch)
    got = _state(run_id, runs.claim_or_row(run_id, TOKEN, step))
    for run in (reference, got):  # the user ids differ by construction
        for part in (run["row"], run["returned"][-1] if isinstance(run["returned"], tuple) else run["returned"]):
            if isinstance(part, dict):
                part.pop("user_id", None)
    assert got == reference
    assert sent == (["_claim_as_expected"] if as_expected else ["_claim_as_expected", "_claim_raw"]), \
        "one query when the row is as expected; the two-query claim after it otherwise"


def test_a_rescue_claims_through_the_two_query_claim(store, monkeypatch):
    """A rescue carries no step: it expects nothing of the row."""
    run_id, _ = _submitted(f"u-rescue-{store}")
    sent = _spy(monkeypatch)
    assert isinstance(runs.claim_or_row(run_id, TOKEN, None), Claim)
    assert sent == ["_claim_raw"]


def test_a_retry_after_the_first_commit_landed_returns_the_claim_it_made(store, monkeypatch):
    """The one query committed but its reply was lost: db_retry runs it again; the row's owner is now this
    token (not as expected), so the two-query claim finds its own attempt and returns that claim."""
    run_id, step = _submitted(f"u-retry-{store}")
    real = runs._claim_as_expected
    calls: list[Any] = []

    def commit_then_lose_the_reply(*args: Any) -> Any:
        calls.append(real(*args))
        if len(calls) == 1:
            raise get_engine().dialect.dbapi.OperationalError(2013, "Lost connection to MySQL server during query")
        return calls[-1]

    monkeypatch.setattr(runs, "_claim_as_expected", commit_then_lose_the_reply)
    c = runs.claim_or_row(run_id, TOKEN, step)
    assert isinstance(c, Claim) and isinstance(calls[0], Claim)
    assert calls[1] is runs._NOT_AS_EXPECTED, "the retry finds the row claimed (by us)"
    assert (c.epoch, c.attempt_id, c.token) == (calls[0].epoch, calls[0].attempt_id, TOKEN)
    with transaction(readonly=True) as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(run_attempts).where(
            run_attempts.c.run_id == run_id)).scalar_one() == 1, "written once"
    assert [e.kind for e in ledger.history(run_id)].count("claimed") == 1
