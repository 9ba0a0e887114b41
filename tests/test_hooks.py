"""Hooks on real workers: every call recorded after its commit, a takeover seen, a raising hook harmless."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from checkpoints.db import transaction
from fencing import faults
from fencing.connection import get_redis
from harness.verdict import check_run
from tasks import hooks, submit_run
from tests.apps.hooks_app import CALLS_KEY
from tests.workers_fixture import wait_for, wait_terminal

APP = "tests.apps.hooks_app"


def calls(run_id: str) -> list[dict[str, Any]]:
    return [c for c in (json.loads(x) for x in get_redis().lrange(CALLS_KEY, 0, -1)) if c["run_id"] == run_id]


def calls_through_on_finished(run_id: str) -> list[dict[str, Any]]:
    """The run's hook calls once on_finished is among them: the ending calls it after the terminal commit
    that `wait_terminal` sees, and after the final event."""
    return wait_for(lambda: (seen := calls(run_id)) and any(c["hook"] == "on_finished" for c in seen) and seen,
                    10, "on_finished to be called")


def test_every_hook_of_a_run_is_called_and_a_raising_hook_leaves_it_done(workers):
    w = workers.start("a", FENCED_IMPORTS=APP, TEST_HOOKS_RAISE="1")
    run_id = submit_run("u1", "buy headphones")
    [run] = wait_terminal([run_id], timeout=40)
    assert run.state == "done", "a hook that raises must never break the run"
    v = check_run(run_id)
    assert v.ok, v.failures
    seen = calls_through_on_finished(run_id)
    names = [c["hook"] for c in seen]
    assert names[0] == "on_claim" and names[-1] == "on_finished", names
    assert seen[-1]["state"] == "done"
    assert names.count("on_claim") == run.step + 1, "one claim per step (each step its own delivery)"
    assert [c["step"] for c in seen if c["hook"] == "on_step_done"] == list(range(run.step)), names
    assert "on_takeover" not in names
    log = wait_for(lambda: (text := w.log_path.read_text()) and "hook on_finished broke" in text and text, 10,
                   "the raising on_finished to be logged")
    assert "hook_failed" in log and "hook on_finished broke" in log, "a raising hook is logged"
    assert any("hook_failed" in line and run_id in line and "epoch" in line for line in log.splitlines()), \
        "the failure names the run and its epoch"


def test_a_run_taken_over_after_a_kill_shows_on_takeover(workers):
    workers.start("a", FENCED_IMPORTS=APP)
    workers.start("b", FENCED_IMPORTS=APP)
    faults.arm("after_tools")
    run_id = submit_run("u1", "buy running shoes")
    hit = faults.next_hit(30)
    assert hit and hit[1] == run_id, "no worker reached after_tools"
    workers.by_pid(hit[2]).kill(signal.SIGKILL)
    [run] = wait_terminal([run_id], timeout=40)
    assert run.state == "done"
    seen = calls_through_on_finished(run_id)
    takeovers = [c for c in seen if c["hook"] == "on_takeover"]
    assert len(takeovers) == 1, [c["hook"] for c in seen]
    t = takeovers[0]
    assert t["phase"] == "decided" and t["step"] == 0 and t["previous_owner"], t
    assert t["epoch"] > min(c["epoch"] for c in seen if c["hook"] == "on_claim"), "the taker's epoch is newer"
    assert [c["hook"] for c in seen][-1] == "on_finished"


def test_hooks_refuse_to_run_inside_a_transaction(mysql_store):
    """A hook must never run while a fenced transaction holds the run's row (it could wait on anything)."""
    got: list[str] = []

    class H(hooks.Hooks):
        def on_claim(self, run_id: str, epoch: int, step: int, agent: str) -> None:
            got.append(run_id)

    h = hooks.add_hooks(H())
    try:
        with pytest.raises(RuntimeError, match="inside a database transaction"), transaction():
            hooks.claimed("r1", 1, 0, "shopper")
        assert got == []
        hooks.claimed("r2", 1, 0, "shopper")
        assert got == ["r2"]
    finally:
        hooks.remove_hooks(h)


def test_a_raising_hook_is_logged_and_the_next_hook_still_runs(mysql_store, caplog):
    got: list[str] = []

    class Bad(hooks.Hooks):
        def on_finished(self, run_id: str, epoch: int, state: str, data: dict[str, Any]) -> None:
            raise RuntimeError("boom")

    class Good(hooks.Hooks):
        def on_finished(self, run_id: str, epoch: int, state: str, data: dict[str, Any]) -> None:
            got.append(state)

    bad, good = hooks.add_hooks(Bad()), hooks.add_hooks(Good())
    try:
        hooks.finished("r3", 7, "done", {})
    finally:
        hooks.remove_hooks(bad)
        hooks.remove_hooks(good)
    assert got == ["done"]
    assert any("hook_failed" in r.getMessage() and "r3" in r.getMessage() and "epoch=7" in r.getMessage()
               and "boom" in r.getMessage() for r in caplog.records), caplog.text
    with pytest.raises(TypeError):
        hooks.add_hooks(object())  # type: ignore[arg-type]
