"""FencedTask and @step on real workers: each step its own wake-up, a finished step never re-run, a step's
result what the next one sees, the effect once, through a SIGKILL and a freeze of the holder."""

from __future__ import annotations

import json
import signal
import time

import pytest

from checkpoints import ledger, runs
from fenced import FencedTask, InvalidRequest, TerminalError
from fencing import events, faults
from fencing.connection import get_redis
from harness.verdict import check_run
from tests.apps.pipeline import checkout, fetch_order
from tests.workers_fixture import wait_for, wait_terminal, wait_zombie_refused

APPS = {"FENCED_IMPORTS": "examples.shopping,tests.apps.pipeline"}


def counts(kind: str, run_id: str) -> dict[str, int]:
    return {k: int(v) for k, v in get_redis().hgetall(f"fenced-test:{kind}:{run_id}").items()}


def test_the_body_outside_a_run_is_a_plain_call():
    assert fetch_order("o-1") == {"order_id": "o-1", "cents": 300}


def test_arguments_must_be_json_and_celery_scheduling_is_refused(mysql_store):
    with pytest.raises(InvalidRequest, match="arguments must be JSON"):
        checkout.delay(object())
    with pytest.raises(TypeError, match="countdown"):
        checkout.apply_async(("o-1",), countdown=5)
    assert runs.list_runs() == [], "a refused submit writes nothing"


def test_each_step_is_its_own_delivery_and_runs_once(workers):
    workers.start("a", **APPS)
    workers.start("b", **APPS)
    handles = [checkout.delay(f"order-{n}") for n in range(3)]
    done = wait_terminal([h.id for h in handles], timeout=40)
    for h, run in zip(handles, done, strict=True):
        assert run.state == "done", (run.state, run.error)
        assert run.agent == "tests.apps.pipeline.checkout"
        value = h.result()
        assert value["receipt"].startswith(f"order {json.loads(run.query)['args'][0]} paid")
        assert counts("steps", h.id) == {"fetch_order": 1, "charge": 1, "receipt": 1}
        assert counts("charges", h.id) == {"performed": 1}
        # three steps, three claims: the first two handed over by checkpoint B, the last one finished
        claims = [e for e in ledger.history(h.id) if e.kind == "claimed"]
        assert [c.reason.split()[1] for c in claims] == ["0", "1", "2"]
        assert [e.eid for e in events.read(h.id) if e.type == "step_started"] == ["s0:start", "s1:start", "s2:start"]
        v = check_run(h.id)
        assert v.ok, v.failures


def test_sigkill_before_the_effect_reruns_only_the_unfinished_step(workers):
    workers.start("a", **APPS)
    workers.start("b", **APPS)
    faults.arm("before_effect")
    handle = checkout.delay("order-k")
    hit = faults.next_hit(30)
    assert hit and hit[1] == handle.id, hit
    workers.by_pid(hit[2]).kill(signal.SIGKILL)
    [run] = wait_terminal([handle.id], timeout=40)
    assert run.state == "done", run.error
    assert counts("steps", handle.id) == {"fetch_order": 1, "charge": 2, "receipt": 1}, \
        "the checkpointed step is replayed, not re-run; the interrupted one runs again"
    assert counts("charges", handle.id) == {"performed": 1}
    v = check_run(handle.id)
    assert v.ok, v.failures
    assert v.takeovers == 1


def test_a_frozen_holder_is_fenced_out_of_its_effect(workers):
    a = workers.start("a", **APPS)
    faults.arm("before_effect", action="stop")
    handle = checkout.delay("order-z")
    hit = faults.next_hit(30)
    assert hit and hit[1] == handle.id and a.pid in (hit[2],), hit
    wait_for(lambda: a.alive and _stopped(a.pid), 10, "the holder to freeze itself")
    workers.start("b", **APPS)
    try:
        [run] = wait_terminal([handle.id], timeout=60)
    finally:
        a.kill(signal.SIGCONT)
    assert run.state == "done"
    wait_zombie_refused(handle.id, a, "effect")
    time.sleep(0.5)
    assert counts("charges", handle.id) == {"performed": 1}, "the zombie woke inside the effect and charged nothing"
    v = check_run(handle.id)
    assert v.ok, v.failures


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_replay_whose_steps_changed_fails_with_a_clear_error(mysql_store):
    import tests.apps.pipeline  # noqa: F401  (registers the task in this process)
    from checkpoints import codec
    from checkpoints.db import transaction
    from checkpoints.schema import run_checkpoints as rc
    from tasks.delivery import deliver

    handle = checkout.delay("order-r")
    blob = codec.encode({"history": [{"step": 0, "name": "app.old_step", "result": {}}]})
    with transaction() as conn:
        conn.execute(rc.update().where(rc.c.run_id == handle.id).values(step=1, phase="done", checkpoint=blob))
    assert deliver(handle.id, None, send_next=lambda *_: None) == "failed"
    run = runs.get_run(handle.id)
    assert run.error_class == "terminal" and "checkpointed as 'app.old_step'" in run.error


def test_fenced_task_is_the_public_base_class():
    assert isinstance(checkout, FencedTask)
    assert TerminalError.failure_class == "terminal"


def test_a_users_own_celery_app_runs_fenced_after_install(workers):
    from tests.apps.own_app import app as own_app
    from tests.apps.own_app import twice

    assert own_app.conf.task_acks_late and own_app.conf.worker_prefetch_multiplier == 1
    workers.start("own", app="tests.apps.own_app")
    handle = twice.delay(5)
    [run] = wait_terminal([handle.id], timeout=30)
    assert run.state == "done", run.error
    assert handle.result() == 20
    assert [e.kind for e in ledger.history(handle.id)].count("claimed") == 2, "two steps, two wake-ups"
    v = check_run(handle.id)
    assert v.ok, v.failures
