"""Cancel and reply from the outside (issue 10): Redis follow-ups that never skip the slot release, a cancel
retried after a lost commit reply, the epoch mirror raised before the cancel commits, and ownership."""

from __future__ import annotations

import json
import threading

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from checkpoints import inputs, ledger, lifecycle, runs
from checkpoints.db import transaction
from checkpoints.schema import run_holds, run_inputs
from fenced_cli import app
from fenced_core.errors import AdmissionRefused, FencedOut
from fencing import admission, epoch, events, keys
from fencing.connection import get_redis
from tasks import queues, submit_run
from tasks.control import cancel_run
from tests.workers_fixture import wait_for

QUEUES = (queues.NORMAL, queues.LARGE)
runner = CliRunner()
CANCELLED_EVENT = "run:cancelled"  # the final event id of a cancelled run


def slots(client, user_id: str) -> list[str]:
    return list(client.zrange(keys.user_slots(user_id), 0, -1))


def running(user_id: str = "u1") -> runs.Claim:
    """A run held at epoch 1 by worker w/1 (its lease and mirror in Redis), with no worker behind it."""
    run_id = submit_run(user_id, "buy a lamp")
    c = runs.claim(runs.get_run(run_id), "w/1")
    assert c is not None and c.epoch == 1
    epoch.raise_epoch(run_id, 1)
    get_redis().set(keys.lease(run_id), "w/1", px=60_000)
    return c


def cancelled_events(client, run_id: str) -> list[dict]:
    return [e.data for e in events.read(run_id, client=client) if e.eid == CANCELLED_EVENT]


# -- defect 15: the slot release is never skipped ------------------------------------------------------
def test_a_failing_redis_step_skips_none_of_the_others(store, redis_client, settings_env):
    """The epoch mirror key is unusable (WRONGTYPE on every epoch script): the slot and the lease still go."""
    settings_env(max_runs_per_user=1)
    c = running()
    run_id = c.run.run_id
    redis_client.delete(keys.epoch(run_id))
    redis_client.hset(keys.epoch(run_id), "broken", "1")  # GET on a hash: every mirror step raises
    result = cancel_run(run_id, "u1")
    assert not result.noop and runs.get_run(run_id).state == "cancelled"
    assert slots(redis_client, "u1") == [], "the user's slot was freed although the mirror step failed"
    assert redis_client.exists(keys.lease(run_id)) == 0, "the lease was dropped although the event step failed"
    admission.admit("next", "u1", QUEUES)  # not refused: the user is below the limit again


def test_a_cancel_retried_after_a_lost_commit_reply_does_the_redis_follow_ups(store, redis_client, settings_env):
    """The first cancel committed but its caller never heard back (so no Redis step ran): the retry,
    which finds the run already cancelled, frees the slot, raises the mirror, ends the stream, drops
    the lease; a third cancel changes nothing more."""
    settings_env(max_runs_per_user=1)
    c = running()
    run_id = c.run.run_id
    first = lifecycle.cancel(run_id, "u1")  # committed; the reply was lost before any Redis step
    assert first.epoch == 2 and slots(redis_client, "u1") == [run_id]
    with pytest.raises(AdmissionRefused):
        admission.admit("next", "u1", QUEUES)

    again = cancel_run(run_id, "u1")
    assert again.noop and again.previous_state == "cancelled" and again.epoch == 2
    assert slots(redis_client, "u1") == [], "the retried cancel gave the slot back"
    assert epoch.current(run_id) == 2, "the mirror is at the canceller's epoch"
    assert redis_client.exists(keys.lease(run_id)) == 0
    assert len(cancelled_events(redis_client, run_id)) == 1, "the stream ends with run:cancelled"
    with pytest.raises(FencedOut):
        events.append(run_id, 1, "late", "tool_call", 0)  # the old holder is refused in Redis too
    admission.admit("next", "u1", QUEUES)

    cancel_run(run_id, "u1")
    assert len(cancelled_events(redis_client, run_id)) == 1, "no second final event"
    assert sum(e.kind == "cancelled" for e in ledger.history(run_id)) == 1, "one cancel in the database"


# -- tightening b: the mirror is raised before the cancel commits ----------------------------------------
def test_the_mirror_is_raised_before_the_cancel_commits(mysql_store, redis_client):
    """The cancel is held inside its transaction (another session locks the run's hold, which the cancel
    settles): already then the old holder's events are refused, while the database still says running."""
    c = running()
    run_id = c.run.run_id
    done: list[object] = []
    with transaction() as blocker:
        blocker.execute(sa.select(run_holds).where(run_holds.c.run_id == run_id).with_for_update()).all()
        t = threading.Thread(target=lambda: done.append(cancel_run(run_id, "u1")), daemon=True)
        t.start()
        wait_for(lambda: epoch.current(run_id) == 2, 3, "the mirror raised to the canceller's epoch")
        with pytest.raises(FencedOut):
            events.append(run_id, 1, "late", "tool_call", 0)
        committed = runs.get_run(run_id)
        assert (committed.state, committed.epoch) == ("running", 1), "the cancel has not committed yet"
        assert not done
    t.join(20)
    assert done and runs.get_run(run_id).state == "cancelled"
    assert [e.eid for e in events.read(run_id)][-1] == CANCELLED_EVENT


def test_a_cancel_that_fails_after_raising_the_mirror_leaves_the_run_claimable(store, redis_client):
    """Raising the mirror early is harmless: if the cancel then fails, the next claim's epoch equals
    the raised mirror, so the run goes on; only the old holder stays refused."""
    c = running()
    run_id = c.run.run_id

    def raise_then_fail(new_epoch: int) -> None:
        epoch.raise_epoch(run_id, new_epoch)
        raise RuntimeError("the cancel's commit failed")

    with pytest.raises(RuntimeError):
        lifecycle.cancel(run_id, "u1", before_commit=raise_then_fail)
    run = runs.get_run(run_id)
    assert (run.state, run.epoch, epoch.current(run_id)) == ("running", 1, 2)
    with pytest.raises(FencedOut):
        events.append(run_id, 1, "late", "tool_call", 0)
    nxt = runs.claim(run, "w/2")
    assert nxt is not None and nxt.epoch >= epoch.current(run_id)
    events.append(run_id, nxt.epoch, "resumed", "task_resumed", 0, raise_mirror=True)  # not fenced out


# -- tightening a: only the run's owner cancels or replies (an operator omits --user) --------------------
def _ledger_kinds(run_id: str) -> list[str]:
    return [e.kind for e in ledger.history(run_id)]


def _refused(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (args, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "belongs to another user" in lines[0], result.stderr
    assert result.stdout == ""
    return lines[0]


def test_cancel_of_someone_elses_run_exits_2_and_writes_nothing(mysql_store, redis_client):
    c = running("alice")
    run_id = c.run.run_id
    before = (_ledger_kinds(run_id), redis_client.xlen(keys.events(run_id)))
    _refused(["cancel", run_id, "--user", "mallory"])
    run = runs.get_run(run_id)
    assert (run.state, run.epoch) == ("running", 1)
    assert (_ledger_kinds(run_id), redis_client.xlen(keys.events(run_id))) == before
    assert epoch.current(run_id) == 1, "not even the mirror moved"
    assert slots(redis_client, "alice") == [run_id] and redis_client.exists(keys.lease(run_id)) == 1

    owner = runner.invoke(app, ["cancel", run_id, "--user", "alice", "--json"])
    assert owner.exit_code == 0, owner.output
    assert json.loads(owner.stdout)["previous_state"] == "running"
    assert runs.get_run(run_id).state == "cancelled"


def test_reply_to_someone_elses_run_exits_2_and_writes_nothing(mysql_store, redis_client):
    c = running("alice")
    run_id = c.run.run_id
    assert inputs.ask(c, "call-1", 1, "which brand?") is None
    runs.park(c, "which brand?", {}, runs.Usage(), "")
    before = _ledger_kinds(run_id)
    _refused(["reply", run_id, "Acme", "--user", "mallory"])
    assert runs.get_run(run_id).state == "waiting"
    with transaction(readonly=True) as conn:
        assert conn.execute(sa.select(run_inputs.c.reply).where(run_inputs.c.run_id == run_id)).scalar() is None
    assert _ledger_kinds(run_id) == before

    owner = runner.invoke(app, ["reply", run_id, "Acme", "--user", "alice"])
    assert owner.exit_code == 0, owner.output
    assert runs.get_run(run_id).state == "queued"
    assert [i.reply for i in inputs.for_run(run_id)] == ["Acme"]


def test_an_operator_without_user_still_cancels_any_run(mysql_store, redis_client):
    c = running("alice")
    result = runner.invoke(app, ["cancel", c.run.run_id])
    assert result.exit_code == 0, result.output
    assert runs.get_run(c.run.run_id).state == "cancelled"
    assert ledger.history(c.run.run_id)[-1].actor == "cli"

