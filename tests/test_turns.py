"""Periodic jobs take turns (fencing.turns): one process per period, and a lone worker gets every one of
its ticks. Real Redis."""

from __future__ import annotations

import time

from fencing import keys
from fencing.turns import take_turn


def _ticks(client: object, key: str, period_ms: int, count: int) -> list[bool]:
    """Tick as a worker's timer does (kombu's call_repeatedly: the next call one period after this one
    started), taking the turn at each tick."""
    taken = []
    for _ in range(count):
        started = time.monotonic()
        taken.append(take_turn(client, key, "me", period_ms))
        time.sleep(max(0.0, period_ms / 1000 - (time.monotonic() - started)))
    return taken


def test_a_lone_worker_takes_every_one_of_its_turns(redis_client):
    """A turn as long as the period was still held at the same worker's next tick about half the time
    (measured 18 of 40): a lone worker checked liveness every 500 ms instead of every 250."""
    taken = _ticks(redis_client, keys.LIVENESS_LOCK, 100, 30)
    assert taken.count(False) == 0, f"skipped {taken.count(False)} of 30 ticks: {taken}"


def test_one_process_per_turn(redis_client):
    assert take_turn(redis_client, keys.SWEEPER_LOCK, "a", 1_000)
    assert not take_turn(redis_client, keys.SWEEPER_LOCK, "b", 1_000), "a second process in the same turn"
    assert redis_client.get(keys.SWEEPER_LOCK) == "a"
    assert 700 <= redis_client.pttl(keys.SWEEPER_LOCK) <= 800, "the turn lasts 80 % of the period"
    time.sleep(0.85)
    assert take_turn(redis_client, keys.SWEEPER_LOCK, "b", 1_000), "the next turn, within the period"


def test_the_periodic_jobs_take_turns(mysql_store, redis_client, settings_env):
    """Each job's lock is a turn: held 80 % of its period."""
    from fencing.fairness import promote_large
    from fencing.liveness import check_connections
    from fencing.registry import SCAN_LOCK, try_scan_lock
    from fencing.sweeper import sweep

    settings_env(liveness_tick_ms=1_000, sweeper_interval_ms=10_000)
    redis_client.zadd(keys.PROCESSES, {"someone": 1})  # a lease holder to check on
    check_connections(lambda _run: None)
    sweep(lambda _run: None)
    promote_large("q-large", "q-normal", 2_000)
    try_scan_lock("me", 5_000)
    for key, period in ((keys.LIVENESS_LOCK, 1_000), (keys.SWEEPER_LOCK, 10_000), (keys.PROMOTER_LOCK, 2_000),
                        (SCAN_LOCK, 5_000)):
        ttl = redis_client.pttl(key)
        assert 0.7 * period <= ttl <= 0.8 * period, f"{key}: held {ttl} ms of a {period} ms period"
