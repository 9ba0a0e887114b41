"""submit_many: per-request outcomes, nothing written for a refused request, the crash points; real Redis, MariaDB,
SQLite and workers."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
import sqlalchemy as sa

from checkpoints import accounts, ledger, runs
from checkpoints.db import transaction
from checkpoints.schema import run_checkpoints, run_holds, run_ledger, user_accounts
from fenced_core.errors import AdmissionRefused, InsufficientCredits, InvalidRequest
from fencing import keys
from fencing.connection import get_redis
from harness.verdict import check_run
from tasks import queues, submit_run
from tasks import submit as submit_mod
from tasks.submit import SubmitRequest, submit_many
from tests.workers_fixture import wait_for, wait_terminal

R = SubmitRequest


def count(table: sa.Table, **where: str) -> int:
    q = sa.select(sa.func.count()).select_from(table)
    for column, value in where.items():
        q = q.where(table.c[column] == value)
    with transaction(readonly=True) as conn:
        return int(conn.execute(q).scalar() or 0)


def slots(client: redis.Redis, user_id: str) -> list[str]:
    return sorted(client.zrange(keys.user_slots(user_id), 0, -1))  # type: ignore[arg-type]


def queued_messages(client: redis.Redis) -> int:
    return int(client.llen(queues.NORMAL)) + int(client.llen(queues.LARGE))  # type: ignore[arg-type]


def broke_user(user_id: str, balance: int) -> None:
    with transaction() as conn:
        conn.execute(user_accounts.insert().values(user_id=user_id, balance_credits=balance, held_credits=0,
                                                   updated_at_ms=0))


def mixed_batch(settings_env: Callable[..., None]) -> tuple[list[SubmitRequest], str]:
    """A batch of every kind of request; returns it and the run id of a key used before the batch."""
    settings_env(max_runs_per_user=2, default_balance_credits=100)
    old = submit_run("u_old", "buy a lamp", idempotency_key="old")
    broke_user("u_broke", 10)
    return [
        R("u_ok", "buy headphones"),                                   # 0 accepted
        R("u_ok", "buy headphones", idempotency_key="k1"),             # 1 accepted (keyed)
        R("u_ok", "buy headphones", idempotency_key="k1"),             # 2 same key, same request: run of 1
        R("u_ok", "buy a desk", idempotency_key="k1"),                 # 3 same key, another query: refused
        R("u_lim", "buy headphones"),                                  # 4 accepted
        R("u_lim", "buy headphones"),                                  # 5 accepted
        R("u_lim", "buy headphones"),                                  # 6 over the user's limit
        R("u_poor", "buy headphones", kind="large"),                   # 7 accepted: 60 of 100
        R("u_poor", "buy headphones", kind="large"),                   # 8 40 left < 60: refused
        R("u_broke", "buy headphones"),                                # 9 10 < 20: refused
        R("u_bad", "buy headphones", kind="huge"),                     # 10 bad kind
        R("u_old", "buy a lamp", idempotency_key="old"),               # 11 used before: that run
        R("u_old", "buy a sofa", idempotency_key="old"),               # 12 used before, other query: refused
    ], old


def check_mixed(out: list[submit_mod.SubmitOutcome], old: str, client: redis.Redis) -> list[str]:
    """Assert the outcomes and that nothing exists for the refused requests; returns the accepted run ids."""
    accepted = [out[i].run_id for i in (0, 1, 4, 5, 7)]
    assert all(accepted) and len(set(accepted)) == 5, out
    assert out[2].run_id == out[1].run_id and out[2].deduplicated
    assert out[11].run_id == old and out[11].deduplicated
    assert all(out[i].run_id is None for i in (3, 6, 8, 9, 10, 12)), out
    assert isinstance(out[3].refused, InvalidRequest) and f"already used for run {out[1].run_id}" in str(out[3].refused)
    assert isinstance(out[6].refused, AdmissionRefused) and out[6].refused.limit == "user"
    assert "max_runs_per_user=2" in str(out[6].refused)
    assert isinstance(out[8].refused, InsufficientCredits) and (out[8].refused.needed, out[8].refused.available) == (
        60, 40)
    assert isinstance(out[9].refused, InsufficientCredits) and out[9].refused.available == 10
    assert isinstance(out[10].refused, InvalidRequest) and "'huge'" in str(out[10].refused)
    assert isinstance(out[12].refused, InvalidRequest) and f"already used for run {old}" in str(out[12].refused)
    # Nothing for the refused: rows, holds, ledger entries, credits, slots, messages.
    assert count(run_checkpoints) == count(run_holds) == 6  # five accepted + the older keyed run
    assert count(run_ledger, kind="submitted") == 6
    assert {r.run_id for r in runs.list_runs(limit=100)} == {*accepted, old}
    assert all(r.state == "queued" and r.epoch == 0 for r in runs.list_runs(limit=100))
    held = {u: accounts.get_account(u).held_credits for u in ("u_ok", "u_lim", "u_poor", "u_broke", "u_bad")}
    assert held == {"u_ok": 40, "u_lim": 40, "u_poor": 60, "u_broke": 0, "u_bad": 0}
    assert count(user_accounts, user_id="u_bad") == 0
    assert slots(client, "u_ok") == sorted(accepted[:2]) and slots(client, "u_lim") == sorted(accepted[2:4])
    assert slots(client, "u_poor") == [accepted[4]] and slots(client, "u_broke") == [] == slots(client, "u_bad")
    assert slots(client, "u_old") == [old]
    assert client.hlen(f"{keys.PREFIX}:{keys.ADMISSION_TAG}:slot-owners") == 6
    assert queued_messages(client) == 6 and client.zcard(keys.ADMITTED_UNSENT) == 0
    for run_id in accepted:
        assert [e.kind for e in ledger.history(run_id)] == ["submitted"]
    return [r for r in accepted if r]


def test_mixed_batch_gives_per_request_outcomes_and_writes_nothing_for_refusals(store, redis_client, settings_env):
    assert submit_many([]) == []
    batch, old = mixed_batch(settings_env)
    check_mixed(submit_many(batch), old, redis_client)


def test_accepted_runs_finish_on_a_real_worker(settings_env, workers):
    # settings_env first: torn down after the workers fixture, whose history checker reads the same balance.
    batch, old = mixed_batch(settings_env)
    accepted = check_mixed(submit_many(batch), old, get_redis())
    workers.start("w1", FENCED_STUB_STEP_MS="50")
    ended = wait_terminal([*accepted, old], timeout=60)
    assert [r.state for r in ended] == ["done"] * 6
    for run_id in accepted:
        verdict = check_run(run_id)
        assert verdict.ok, verdict.failures
    wait_for(lambda: all(not slots(get_redis(), u) for u in ("u_ok", "u_lim", "u_poor")), 10, "slots given back")


def test_a_lost_send_is_woken_by_the_sweeper(workers, settings_env, monkeypatch):
    """The submitter dies after the commit, before any wake-up: the sweeper sends them."""

    def die(_woken: object) -> None:
        raise KeyboardInterrupt("the submitter died after its commit")

    monkeypatch.setattr(submit_mod, "_wake", die)
    settings_env(max_runs_per_user=10)
    with pytest.raises(KeyboardInterrupt):
        submit_many([R("u1", "buy headphones"), R("u1", "buy a lamp"), R("u1", "buy a desk", kind="huge")])
    client = get_redis()
    ids = sorted(r.run_id for r in runs.list_runs())
    assert len(ids) == 2 and queued_messages(client) == 0 and slots(client, "u1") == ids
    workers.start("w1", FENCED_STUB_STEP_MS="50")
    ended = wait_terminal(ids, timeout=60)
    assert [r.state for r in ended] == ["done", "done"]
    for run_id in ids:
        assert any(e.kind == "rescue" and "woken by the sweeper" in e.reason for e in ledger.history(run_id))
        verdict = check_run(run_id)
        assert verdict.ok, verdict.failures


def test_a_failed_transaction_gives_the_slots_back(redis_client, settings_env, tmp_path):
    settings_env(max_runs_per_user=10, db_url=f"sqlite:///{tmp_path / 'no-schema.db'}")
    with pytest.raises(sa.exc.OperationalError):
        submit_many([R("u1", "buy headphones"), R("u2", "buy a lamp")])
    assert slots(redis_client, "u1") == [] == slots(redis_client, "u2")
    assert redis_client.zcard(keys.ADMITTED_UNSENT) == 0 and queued_messages(redis_client) == 0


def test_a_key_stored_between_the_lookup_and_the_insert_is_that_run(store, redis_client, settings_env):
    """A concurrent submit of the same key commits after this batch looked the key up: the batch's
    first insert fails whole (IntegrityError), the next attempt finds the run and answers with it."""
    settings_env(max_runs_per_user=10)
    other = submit_run("u1", "buy a lamp", idempotency_key="k")
    out: list[submit_mod.SubmitOutcome | None] = [None, None]
    woken = submit_mod._create([(0, runs.NewRun(other, "u1", "normal", "buy a lamp", "shopping")),
                                (1, runs.NewRun(runs.new_run_id(), "u1", "normal", "buy a desk", "shopping"))], out)
    assert out[0] == submit_mod.SubmitOutcome(other, deduplicated=True)
    assert out[1] is not None and out[1].run_id is not None and not out[1].deduplicated
    assert [n.run_id for n in woken] == [other, out[1].run_id], "a second wake-up for the stored run is harmless"
    assert count(run_checkpoints) == count(run_holds) == 2 and accounts.get_account("u1").held_credits == 40


def test_the_submit_benchmark_measures_what_it_says(tmp_path):
    """A smoke run of `python -m bench.submit` (its own Redis and database): every phase left one
    message per submit, and the fenced ones one run row per submit. Speed is not judged."""
    import json
    import subprocess
    import sys

    from tests.conftest import MYSQL_URL, ROOT

    out = tmp_path / "submit.json"
    subprocess.run([sys.executable, "-m", "bench.submit", "--runs", "30", "--batches", "10",
                    "--db-url", MYSQL_URL + "_bench", "--json", str(out)], cwd=ROOT, check=True, timeout=120)
    figures = json.loads(out.read_text())
    names = [p["name"] for p in figures["phases"]]
    assert names == ["submit_run", "submit_many (batches of 10)", "plain Celery apply_async"]
    assert all(p["messages_waiting"] == 30 and p["per_s"] > 0 for p in figures["phases"])
    assert [p["run_rows"] for p in figures["phases"]] == [30, 30, None]
    assert figures["target_per_s"] == 500 and isinstance(figures["met"], bool)
