"""harness.verdict judges a user's effects too (what `fenced chaos --app` and the tests rely on): each
effect created once per request key, and kept in the effects table. Runs driven in-process on both stores."""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

import tests.apps.pipeline  # noqa: F401 - registers the FencedTask the runs use
from checkpoints import ledger
from checkpoints.db import transaction
from checkpoints.schema import effects
from fencing import events, keys
from harness.verdict import check_run, effect_keys
from tasks.delivery import deliver
from tests.apps.pipeline import checkout


def _run_to_done(order_id: str) -> str:
    run_id = checkout.delay(order_id).id
    sent: list[int | None] = [None]
    for _ in range(10):
        outcome = deliver(run_id, sent[-1], lambda _r, s: sent.append(s))
        if outcome == "done":
            return run_id
        assert outcome == "continue", outcome
    raise AssertionError("the run did not finish in 10 deliveries")


def test_a_sound_run_counts_its_effect_once(store, redis_client):
    run_id = _run_to_done("order-v1")
    v = check_run(run_id)
    assert v.ok, v.failures
    assert v.effects == 1 and len(effect_keys(run_id)) == 1


def test_an_effect_created_twice_fails_the_verdict(store, redis_client):
    run_id = _run_to_done("order-v2")
    (key,) = effect_keys(run_id)
    ledger.record(run_id, 9, "forged", "effect_created", f"charge done once: {key}", {"key": key})
    v = check_run(run_id)
    assert "effects" in v.failed and key in v.failed["effects"], v.failures


def test_an_effect_whose_record_is_gone_fails_the_verdict(store, redis_client):
    run_id = _run_to_done("order-v3")
    with transaction() as conn:
        conn.execute(sa.delete(effects).where(effects.c.run_id == run_id))
    v = check_run(run_id)
    assert "not recorded" in v.failed.get("effects", ""), v.failures


def test_the_verdict_waits_for_a_final_event_that_follows_the_terminal_commit(store, redis_client):
    """The ending commits the row, then appends the final event: a verdict read between the two (the CI
    failure of 2026-12-03: `0 run_done events`) reads the stream again and judges what follows."""
    run_id = _run_to_done("order-v4")
    (done,) = [e for e in events.read(run_id) if e.type == "run_done"]
    redis_client.xdel(keys.events(run_id), done.stream_id)
    assert check_run(run_id, final_event_grace_s=0).failed.get("stream") == "0 run_done events in the live view"
    late = threading.Timer(0.5, lambda: events.append(run_id, done.epoch, done.eid, done.type, done.step,
                                                      done.data))
    late.start()
    try:
        v = check_run(run_id, final_event_grace_s=5)
    finally:
        late.join()
    assert v.ok, v.failures


def test_a_final_event_that_never_comes_still_fails_the_verdict(store, redis_client):
    run_id = _run_to_done("order-v5")
    (done,) = [e for e in events.read(run_id) if e.type == "run_done"]
    redis_client.xdel(keys.events(run_id), done.stream_id)
    started = time.monotonic()
    v = check_run(run_id, final_event_grace_s=0.5)
    assert v.failed.get("stream") == "0 run_done events in the live view", v.failures
    assert time.monotonic() - started >= 0.5  # it did wait before judging
