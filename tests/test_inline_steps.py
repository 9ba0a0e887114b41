"""Inline steps (issue 17), in-process on both stores: a delivery that finished a step claims the next one
itself, holding the lease all along, up to its `inline` budget; each inline claim is a claim like any
other (epoch + 1, an attempt row, a ledger entry that says it was inline); a lease lost, a drain, or a
spent budget hands the next step over through the broker instead."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from celery.worker import state as worker_state

import examples.shopping  # noqa: F401 - registers the demo agent the deliveries run
from checkpoints import ledger, runs
from checkpoints.db import transaction
from checkpoints.schema import run_attempts
from fencing import events, keys
from harness.verdict import check_run
from tasks import delivery, queues, submit_run
from tasks.delivery import deliver
from tasks.step import StepRunner
from tests.workers_fixture import wait_for, wait_terminal

QUERY = "wireless headphones under $100"


@pytest.fixture(autouse=True)
def _inlining_allowed() -> Iterator[None]:
    yield
    delivery._Inlining.allowed = True  # a test that stopped it (as a drain does) leaves it as it found it
    delivery.set_slots(None)  # in-process deliveries outside a worker: the pool size is unknown


def _attempts(run_id: str) -> list[sa.Row]:
    with transaction(readonly=True) as conn:
        return list(conn.execute(sa.select(run_attempts).where(run_attempts.c.run_id == run_id)
                                 .order_by(run_attempts.c.id)).all())


def _claims(run_id: str) -> list[ledger.Entry]:
    return [e for e in ledger.history(run_id) if e.kind in ("claimed", "takeover")]


def test_one_delivery_runs_the_whole_run_inline_each_step_claimed_and_shown_once(store, redis_client):
    run_id = submit_run("u-inline", QUERY)
    sent: list[int] = []
    assert deliver(run_id, None, lambda _r, s: sent.append(s), inline=8) == "done"
    assert sent == [], "no continuation went through the broker"
    run = runs.get_run(run_id)
    claims = _claims(run_id)
    assert len(claims) == run.step + 1 >= 3, "one claim per step"
    assert [c.kind for c in claims] == ["claimed"] * len(claims), "never a takeover of itself"
    assert [c.epoch for c in claims] == list(range(1, len(claims) + 1)), "each inline claim raised the epoch"
    assert "inline" not in claims[0].detail and "inline" not in claims[0].reason
    for step, c in enumerate(claims[1:], start=1):
        assert c.detail.get("inline") is True and c.reason.startswith(f"step {step} claimed, "), c
        assert c.reason.endswith(f"(inline: the delivery that ran step {step - 1} went on)"), c
    assert len({c.actor for c in claims}) == 1, "one delivery, one lease token, start to end"
    view = events.live_view(events.read(run_id))
    assert len(view) == len(events.read(run_id)), "no event superseded or repeated"
    assert sorted({e.step for e in view if e.type != "run_done"}) == list(range(run.step + 1))
    assert not redis_client.exists(keys.lease(run_id)), "the run ended; the lease went with it"


def test_a_step_done_event_rides_with_the_renewal_that_lets_the_step_go_on(store, redis_client, monkeypatch):
    """The check before checkpoint B renews the lease in one round trip; the step's step_done event goes
    at its head instead of in a round trip of its own. Each step's step_done is in the stream once, before
    the next step's events; only the last step (no renewal: the run ends) appends its own."""
    run_id = submit_run("u-ride", QUERY)
    alone: list[str] = []
    real = events.Appends.send

    def counted(self: events.Appends, client=None, riders=()):  # type: ignore[no-untyped-def]
        alone.extend(eid for eid, *_ in self.items)
        return real(self, client, riders)

    monkeypatch.setattr(events.Appends, "send", counted)
    assert deliver(run_id, None, lambda _r, s: None, inline=8) == "done"
    steps = runs.get_run(run_id).step
    done = [e for e in events.read(run_id) if e.type == "step_done"]
    assert [e.eid for e in done] == [f"s{i}:done" for i in range(steps)], "each step's step_done, once, in order"
    assert not [eid for eid in alone if eid in {e.eid for e in done}], "every step_done rode with its renewal"
    order = [e.eid for e in events.read(run_id)]
    for i in range(steps):
        assert order.index(f"s{i}:done") < order.index(f"s{i + 1}:start")


def test_a_refused_step_done_riding_with_the_renewal_fences_the_step_out(store, redis_client):
    """A newer epoch owns the run: the step_done riding with the renewal is refused and FencedOut reaches
    the step (fence_rejected), not swallowed as a failed inline check (which would hand over as if the
    event were out). Nothing is appended."""
    from fenced_core.errors import FencedOut
    from fencing.epoch import raise_epoch
    from fencing.lease import Lease

    lease = Lease("r-ride", 60_000)
    assert lease.acquire(0)
    raise_epoch("r-ride", 5)
    riding = events.Appends("r-ride", 4, [("s0:done", "step_done", 0, {"name": "plan"})])
    with pytest.raises(FencedOut):
        delivery._goes_on(lease, 0, 8, time.monotonic(), riding)
    assert riding.ids is None and events.read("r-ride") == []
    fresh = events.Appends("r-ride", 5, [("s0:done", "step_done", 0, {"name": "plan"})])
    assert delivery._goes_on(lease, 0, 8, time.monotonic(), fresh) is True
    assert fresh.ids and [e.eid for e in events.read("r-ride")] == ["s0:done"]



@pytest.mark.parametrize("ran", [True, False], ids=["ran, reply lost", "never ran"])
def test_a_rider_whose_round_trip_failed_is_appended_once_by_the_step(redis_client, monkeypatch, ran):
    """The renewal carrying step_done failed (RedisUnavailable: a lost reply, or on a Redis Cluster another
    node of the pipeline failing after the append's node ran it): the inline check hands over, and the
    step, appending the event itself, first looks whether it landed. It is in the stream once either way,
    under the id the step records (the chaos checker's stream_duplicate found it twice before)."""
    from fencing.connection import RedisUnavailable
    from fencing.lease import Lease
    from fencing.scripts import Scripts

    lease = Lease("r-lost", 60_000)
    assert lease.acquire(0)
    real = Scripts.execute

    def failing(self, client, build, raise_on_error=True):  # type: ignore[no-untyped-def]
        if ran:
            real(self, client, build, raise_on_error)
        raise RedisUnavailable("Redis unavailable: ConnectionError: reply lost (test)")

    riding = events.Appends("r-lost", 1, [("s0:done", "step_done", 0, {"name": "plan"})], raise_mirror=True)
    monkeypatch.setattr(Scripts, "execute", failing)
    assert delivery._goes_on(lease, 0, 8, time.monotonic(), riding) is False  # handed over the ordinary way
    monkeypatch.setattr(Scripts, "execute", real)
    assert riding.ids is None and riding.unsettled
    ids = riding.send()  # what StepRunner.sent does with an event no round trip settled
    stream = events.read("r-lost")
    assert [e.eid for e in stream] == ["s0:done"]
    assert ids == [stream[0].stream_id]

def test_the_budget_spent_the_next_step_is_handed_over(store, redis_client):
    run_id = submit_run("u-budget", QUERY)
    sent: list[int] = []
    assert deliver(run_id, None, lambda _r, s: sent.append(s), inline=1) == "continue"
    assert sent == [2], "steps 0 and 1 ran here; step 2 goes through the broker"
    assert redis_client.get(keys.lease(run_id)) == "handoff:2"
    assert deliver(run_id, 2, lambda _r, s: sent.append(s)) == "continue", "inline=0: one step per delivery"
    assert sent == [2, 3]


def test_a_lease_lost_during_the_step_ends_the_delivery_at_that_step(store, redis_client, monkeypatch):
    """The step finished (checkpoint B is fenced by the epoch, not the lease), but another holder has the
    lease now: the delivery must not claim the next step itself; it hands over as ever."""
    run_id = submit_run("u-lost", QUERY)
    real = StepRunner.step_done

    def lose_the_lease_then_finish(self: StepRunner, *args):  # type: ignore[no-untyped-def]
        redis_client.set(keys.lease(run_id), "someone-else/0", px=60_000)
        return real(self, *args)

    monkeypatch.setattr(StepRunner, "step_done", lose_the_lease_then_finish)
    sent: list[int] = []
    assert deliver(run_id, None, lambda _r, s: sent.append(s), inline=8) == "continue"
    assert sent == [1], "the continuation went out through the broker"
    assert len(_claims(run_id)) == 1, "no inline claim without the lease"
    assert redis_client.get(keys.lease(run_id)) == "someone-else/0", "the other holder's lease is untouched"


def test_a_lease_lost_after_the_inline_claim_runs_nothing_more_and_the_run_is_rescued(store, redis_client,
                                                                                     monkeypatch):
    """Checkpoint B claimed step 1 for this delivery, then the watchdog lost the lease (a renewal refused):
    step 1 is not run here (no event of it, its attempt closed as lease_lost), the lease is let go with
    the index entry due now, and the rescue that follows takes the run over from checkpoint B."""
    run_id = submit_run("u-lost-after", QUERY)
    real = StepRunner.step_done

    def finish_then_lose_the_lease(self: StepRunner, *args):  # type: ignore[no-untyped-def]
        outcome = real(self, *args)
        assert outcome.claimed is not None, "the step claimed the next one inline"
        self.lease.lost = True  # as the watchdog marks a lease whose renewal was refused
        return outcome

    monkeypatch.setattr(StepRunner, "step_done", finish_then_lose_the_lease)
    sent: list[int] = []
    assert deliver(run_id, None, lambda _r, s: sent.append(s), inline=8) == "lease_lost"
    assert sent == [], "nothing handed over: the reaper rescues the run"
    run = runs.get_run(run_id)
    assert (run.step, run.epoch, run.phase) == (1, 2, "done"), "step 1 claimed with checkpoint B, never run"
    assert not [e for e in events.read(run_id) if e.step == 1], "no event of step 1"
    assert [(a.step, a.epoch, a.outcome) for a in _attempts(run_id)] == [(0, 1, "step_done"), (1, 2, "lease_lost")]
    assert not redis_client.exists(keys.lease(run_id)), "let go (the index entry is due now)"
    monkeypatch.undo()
    assert deliver(run_id, None, lambda _r, s: sent.append(s), inline=8) == "done", "the rescue"
    claims = _claims(run_id)
    assert [c.kind for c in claims] == ["claimed", "claimed", "takeover", *["claimed"] * (len(claims) - 3)]
    assert check_run(run_id).ok, check_run(run_id).failures


def test_a_draining_process_hands_every_next_step_over(store, redis_client):
    run_id = submit_run("u-drain", QUERY)
    delivery.stop_inlining()
    sent: list[int] = []
    assert deliver(run_id, None, lambda _r, s: sent.append(s), inline=8) == "continue"
    assert sent == [1] and len(_claims(run_id)) == 1


def test_a_step_past_its_timeout_never_goes_on_inline(store, redis_client, monkeypatch):
    """The watchdog let the lease go at the step timeout (it is left to run out, unrenewed); a step that
    finishes anyway must not renew it by going on: the next step goes through the broker."""
    run_id = submit_run("u-timeout", QUERY)
    real = StepRunner.step_done

    def past_its_timeout_then_finish(self: StepRunner, *args):  # type: ignore[no-untyped-def]
        self.lease.timed_out = True  # as the watchdog marks a step that overran step_timeout_s
        return real(self, *args)

    monkeypatch.setattr(StepRunner, "step_done", past_its_timeout_then_finish)
    sent: list[int] = []
    assert deliver(run_id, None, lambda _r, s: sent.append(s), inline=8) == "continue"
    assert sent == [1] and len(_claims(run_id)) == 1


def test_past_the_window_or_under_reach_routing_the_next_step_goes_through_the_broker(store, monkeypatch):
    """A delivery starts no inline step after INLINE_WINDOW_S (its Celery task's hard time limit allows
    one more step timeout, no more), and none under `reach`, which routes every step itself."""
    first = submit_run("u-window", QUERY)
    monkeypatch.setattr(delivery, "INLINE_WINDOW_S", 0)
    sent: list[int] = []
    assert deliver(first, None, lambda _r, s: sent.append(s), inline=8) == "continue"
    assert sent == [1]
    monkeypatch.undo()
    second = submit_run("u-reach", QUERY)
    monkeypatch.setattr(delivery.policy, "reach", lambda: True)
    assert deliver(second, None, lambda _r, s: sent.append(s), inline=8) == "continue"
    assert sent == [1, 1]


def _pid(entry: ledger.Entry) -> int:
    return int(entry.actor.split(":")[1])  # host:pid:nonce/delivery


def test_a_draining_worker_ends_its_chain_at_the_step_in_flight_and_hands_the_run_over(workers):
    """Real workers: the holder runs steps inline until SIGTERM; the step in flight finishes, the next one
    goes through the broker to the other worker, claimed there as a handoff (no takeover)."""
    pool = [workers.start(name, FENCED_STUB_STEP_MS="2500") for name in ("a", "b")]
    run_id = submit_run("u-drain", "buy a keyboard")
    wait_for(lambda: len(_claims(run_id)) >= 2, 40, "a second step, claimed inline")
    first, second = _claims(run_id)[:2]
    assert second.detail.get("inline") is True and _pid(second) == _pid(first)
    [holder] = [w for w in pool if w.proc.pid == _pid(first)]
    [other] = [w for w in pool if w is not holder]
    holder.kill(signal.SIGTERM)
    holder.proc.wait(30)
    [run] = wait_terminal([run_id], timeout=60)
    assert run.state == "done"
    v = check_run(run_id)
    assert v.ok and v.takeovers == 0, v.failures
    claims = _claims(run_id)
    by_holder = [c for c in claims if _pid(c) == holder.proc.pid]
    after = claims[len(by_holder):]
    assert claims[:len(by_holder)] == by_holder, "the holder's claims come first, then the other's"
    assert after and all(_pid(c) == other.proc.pid for c in after), "the rest ran on the other worker"
    assert "inline" not in after[0].detail, "handed over through the broker, not claimed inline"


@pytest.mark.parametrize("how", ["FENCED_INLINE_STEPS=0", "prefork"])
def test_a_worker_with_inline_steps_off_or_a_prefork_worker_hands_every_step_over(workers, how):
    """A prefork child never hears of its worker's drain, so it runs no step inline."""
    if how == "prefork":
        workers.start("a", pool="prefork", concurrency=1)
    else:
        workers.start("a", FENCED_INLINE_STEPS="0")
    run_id = submit_run("u-off", "buy a keyboard")
    wait_terminal([run_id], timeout=40)
    claims = _claims(run_id)
    assert len(claims) >= 3 and not any(c.detail.get("inline") for c in claims)


@pytest.mark.parametrize("broker", ["fenced's Redis", "a Redis of its own"])
def test_a_wake_up_waiting_on_the_continuation_queue_goes_before_further_inline_steps(store, redis_client, broker,
                                                                                     settings_env):
    """Other runs' continuations and rescues would wait behind this run's inline steps on a worker whose
    slots are all taken (the in-flight benchmark's takeovers went from ~1 s to 22 s p95): while one
    waits, the delivery hands its next step over through the broker, behind it. The queue's length is
    read with the renewal (one round trip) when the broker is fenced's Redis, on its own otherwise."""
    from fenced_core.settings import get_settings
    from fencing.broker import get_broker_redis, shares_redis

    if broker != "fenced's Redis":
        url = get_settings().redis_url
        settings_env(broker_url=url[: url.rindex("/")] + "/3")
    assert shares_redis() == (broker == "fenced's Redis")
    queue = get_broker_redis()
    queue.lpush(keys.broker_queue(queues.CONTINUE), "someone else's wake-up")
    try:
        waiting = submit_run("u-queue", QUERY)
        sent: list[int] = []
        assert deliver(waiting, None, lambda _r, s: sent.append(s), inline=8) == "continue"
        assert sent == [1] and len(_claims(waiting)) == 1
    finally:
        queue.delete(keys.broker_queue(queues.CONTINUE))
    free = submit_run("u-queue-2", QUERY)
    assert deliver(free, None, lambda _r, s: sent.append(s), inline=8) == "done", "nothing waits: inline"


class _OtherTask:
    """A request of another task the worker runs, as Celery's worker state counts it."""


def test_with_a_slot_free_a_waiting_wake_up_does_not_stop_inline_steps_unless_rescues_are_under_way(
        store, redis_client):
    """A wake-up waiting while this process has a free slot waits on the broker's hand-out, not on us:
    handing over would only queue one more (under load every finishing step did, and the backlog never
    drained: the in-flight benchmark's 1,000 runs took 98 s instead of 78). All slots taken, or a rescue
    under way (a rescued run waits behind everyone's inline steps), the delivery yields as before."""
    from fencing.broker import get_broker_redis

    queue = get_broker_redis()
    queue.lpush(keys.broker_queue(queues.CONTINUE), "someone else's wake-up")
    sent: list[int] = []
    try:
        delivery.set_slots(2)  # this delivery takes one of two slots: one is free
        free = submit_run("u-slot-free", QUERY)
        assert deliver(free, None, lambda _r, s: sent.append(s), inline=8) == "done"
        assert sent == [], "a slot free: every step ran inline though a wake-up waited"
        assert delivery._Inlining.busy == 0, "the delivery gave its slot back"

        delivery.set_slots(1)  # this delivery takes the only slot
        full = submit_run("u-slot-full", QUERY)
        assert deliver(full, None, lambda _r, s: sent.append(s), inline=8) == "continue"
        assert sent == [1] and len(_claims(full)) == 1, "every slot taken: the waiting wake-up goes first"

        delivery.set_slots(2)  # both taken by other tasks of the worker (a user's FencedTasks) as Celery counts
        others = [_OtherTask(), _OtherTask()]  # Celery keeps its requests in a WeakSet
        worker_state.active_requests.update(others)
        try:
            taken = submit_run("u-slot-others", QUERY)
            assert deliver(taken, None, lambda _r, s: sent.append(s), inline=8) == "continue"
            assert sent == [1, 1], "every slot taken, though not all by runs: the waiting wake-up goes first"
        finally:
            worker_state.active_requests.difference_update(others)

        delivery.set_slots(2)
        redis_client.set(keys.RESCUES_UNDER_WAY, "someone", px=5000)
        rescuing = submit_run("u-slot-rescue", QUERY)
        assert deliver(rescuing, None, lambda _r, s: sent.append(s), inline=8) == "continue"
        assert sent == [1, 1, 1] and len(_claims(rescuing)) == 1, "a rescue under way: yield as if full"
    finally:
        queue.delete(keys.broker_queue(queues.CONTINUE))


def test_a_batch_of_rescues_marks_rescues_under_way_for_a_while(store, redis_client):
    """A dead process's runs, rescued together: everyone yields to waiting wake-ups for a while. A run or
    two rescued (a lease that ran out) find a free slot like any wake-up: no mark, nobody yields."""
    from fencing.connection import process_token
    from fencing.reaper import RESCUE_YIELD_MIN_RUNS, RESCUE_YIELD_MS, rescue_many

    few = [submit_run(f"u-few-{i}", QUERY) for i in range(RESCUE_YIELD_MIN_RUNS - 1)]
    sent: list[str] = []
    assert rescue_many(few, 30_000, "a test", sent.append) == few and sent == few
    assert not redis_client.exists(keys.RESCUES_UNDER_WAY)
    batch = [submit_run(f"u-batch-{i}", QUERY) for i in range(RESCUE_YIELD_MIN_RUNS)]
    assert rescue_many(batch, 30_000, "a test", sent.append) == batch and sent == few + batch
    assert redis_client.get(keys.RESCUES_UNDER_WAY) == process_token()
    assert 0 < redis_client.pttl(keys.RESCUES_UNDER_WAY) <= RESCUE_YIELD_MS
    recorded = [e for run_id in few + batch for e in ledger.history(run_id) if e.kind == "rescue"]
    assert [e.epoch for e in recorded] == [0] * len(few + batch), "each rescue recorded with its run's epoch mirror"


def test_every_worker_tells_deliveries_its_pool_size():
    """The slot rule needs the pool's size: fenced's app and an app given fenced by install() both run
    the bootstep that sets it from the worker's concurrency (unknown, not a guess, for anything else)."""
    from types import SimpleNamespace

    from celery import Celery

    from tasks.app import app
    from tasks.bootsteps import SlotsStep
    from tasks.install import install

    assert SlotsStep in app.steps["worker"]
    assert SlotsStep in install(Celery("theirs")).steps["worker"]
    step = SlotsStep.__new__(SlotsStep)
    step.start(SimpleNamespace(concurrency=500))
    assert delivery._Inlining.slots == 500
    step.start(SimpleNamespace(concurrency="auto"))
    assert delivery._Inlining.slots is None
    step.start(SimpleNamespace(concurrency=500))
    step.stop(SimpleNamespace())
    assert delivery._Inlining.slots is None
