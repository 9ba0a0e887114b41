"""Event appends from many runs of one process share round trips (fencing.group_commit), on a real Redis.

Each append stays its own fenced script call: these tests check that sharing a round trip changes
nothing a caller sees (its own stream ids, in its own run's order; a refused epoch refused for that
run only; a failed round trip failing every caller it carried), and that sharing does happen. To make
the sharing certain rather than likely, the leader's round trip is slowed by a few milliseconds (the
real send, with a sleep in front), so callers arriving meanwhile queue behind it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from fenced_core.errors import FencedOut
from fencing import events, group_commit, keys
from fencing.connection import RedisUnavailable, client_for

pytestmark = pytest.mark.timeout(60)  # a caller left waiting forever fails the test, not the suite


def _group(client: Any, delay_s: float) -> group_commit.GroupCommit:
    """The client's group commit with every round trip slowed by `delay_s` (the real send after it)."""
    group = group_commit.GroupCommit(client)
    real = group.scripts.execute_all

    def slow(*args: Any, **kwargs: Any) -> list[Any]:
        time.sleep(delay_s)
        return real(*args, **kwargs)

    group.scripts = type("Slowed", (), {"execute_all": staticmethod(slow)})()  # type: ignore[assignment]
    client.__dict__[group_commit._ATTR] = group
    return group


def _together(n: int, fn: Any) -> list[Any]:
    """Run fn(i) in n threads started together; each one's return value or exception."""
    out: list[Any] = [None] * n
    gate = threading.Barrier(n)

    def one(i: int) -> None:
        gate.wait()
        try:
            out[i] = fn(i)
        except BaseException as exc:  # the test inspects it (FencedOut is a BaseException)
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a caller never returned"
    return out


def test_appends_of_many_runs_share_round_trips_and_each_caller_gets_its_own_ids(redis_client):
    group = _group(redis_client, 0.005)
    per_run = 6

    def run(i: int) -> list[str]:
        ids = []
        for n in range(per_run):
            ids += events.append_many(f"gc-{i}", 1, [(f"e{n}", "step_started", n, {"n": n, "run": i})],
                                      client=redis_client, raise_mirror=n == 0)
        return ids

    results = _together(30, run)
    assert not [r for r in results if isinstance(r, Exception)], results
    for i, ids in enumerate(results):
        entries = redis_client.xrange(keys.events(f"gc-{i}"))
        # Every append landed once, in the run's own order, under the ids its caller was given.
        assert [eid for eid, _fields in entries] == ids
        assert [fields["eid"] for _eid, fields in entries] == [f"e{n}" for n in range(per_run)]
        assert all(f'"run":{i}' in fields["data"] for _eid, fields in entries)
        assert redis_client.get(keys.epoch(f"gc-{i}")) == "1"
    assert group.calls == 30 * (per_run + 1)  # each run's first append raised its mirror too
    assert group.trips < 30 * per_run / 3, (group.trips, group.calls)  # shared: far fewer trips than appends


def test_a_refused_epoch_is_refused_for_its_own_run_only(redis_client):
    group = _group(redis_client, 0.02)
    redis_client.set(keys.epoch("gc-taken"), 5)  # a newer holder owns this run

    def append(i: int) -> list[str]:
        run = "gc-taken" if i == 0 else f"gc-ok-{i}"
        return events.append_many(run, 1, [(f"e{i}", "step_started", 1, {})], client=redis_client)

    results = _together(8, append)
    assert isinstance(results[0], FencedOut), results[0]
    assert redis_client.xlen(keys.events("gc-taken")) == 0
    for i in range(1, 8):
        assert isinstance(results[i], list) and len(results[i]) == 1, results[i]
        assert redis_client.xlen(keys.events(f"gc-ok-{i}")) == 1
    assert group.trips < 8  # the refused append shared a round trip with accepted ones


def test_a_failed_round_trip_fails_every_caller_it_carried_as_redis_unavailable():
    dead = client_for("redis://127.0.0.1:6399/0", socket_timeout=0.5, socket_connect_timeout=0.5)
    group = _group(dead, 0.05)

    results = _together(6, lambda i: events.append_many(f"gc-dead-{i}", 1, [("e", "step_started", 1, {})],
                                                        client=dead))
    assert all(isinstance(r, RedisUnavailable) for r in results), results
    assert group.trips < 6
    # The group is left usable: the next caller leads a round trip of its own (and fails alike).
    with pytest.raises(RedisUnavailable):
        events.append_many("gc-dead-after", 1, [("e", "step_started", 1, {})], client=dead)
    assert group._queued == [] and not group._sending


def test_a_lone_append_goes_at_once_in_a_round_trip_of_its_own(redis_client):
    group = group_commit.GroupCommit(redis_client)
    redis_client.__dict__[group_commit._ATTR] = group
    for n in range(3):
        events.append_many("gc-lone", 1, [(f"e{n}", "step_started", n, {})], client=redis_client)
    assert (group.trips, group.calls) == (3, 3)
    assert redis_client.xlen(keys.events("gc-lone")) == 3
