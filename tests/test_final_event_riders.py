"""A run's ending in one Redis round trip fewer (issue 17): the user's slot goes back in the final event's
round trip, ahead of the append (release_slot.lua riding with append_event.lua), so a client that sees the
final event finds the slot free; a round trip that fails leaves both to the repair that the rescue's
delivery makes. In-process deliveries on both stores."""

from __future__ import annotations

from typing import Any

import examples.shopping  # noqa: F401 - registers the demo agent the deliveries run
from bench.step_counts import _counting
from checkpoints import runs
from fencing import admission, events, faults, group_commit, keys, scripts
from fencing.connection import RedisUnavailable
from fencing.lease import Lease, now_ms
from tasks import endings, hooks, submit_run
from tasks.delivery import deliver

QUERY = "wireless headphones under $100"


def _slots(redis_client: Any, user_id: str) -> list[str]:
    return list(redis_client.zrange(keys.user_slots(user_id), 0, -1))


def _final_events(redis_client: Any, run_id: str) -> list[dict[str, str]]:
    return [fields for _id, fields in redis_client.xrange(keys.events(run_id)) if fields.get("eid") == "run:done"]


def _index_entries(redis_client: Any, run_id: str, scores: bool = False) -> list[Any]:
    """The reaper's entries for `run_id` (any holder's), with their deadlines when `scores`."""
    entries = redis_client.zrange(keys.lease_index(run_id), 0, -1, withscores=True)
    return [(m, s) if scores else m for m, s in entries if m.endswith(f"|{run_id}")]


def _name(call: scripts.Call | scripts.Command) -> str:
    return call.script if isinstance(call, scripts.Call) else call.name


def _deliver_all(run_id: str) -> str:
    sent: list[int] = [0]
    while (outcome := deliver(run_id, sent[-1], lambda _r, s: sent.append(s))) == "continue":
        pass
    return outcome


def test_the_slot_release_rides_ahead_of_the_final_event_in_one_round_trip(store, redis_client, monkeypatch):
    run_id = submit_run("u-ride", QUERY)
    assert _slots(redis_client, "u-ride") == [run_id]
    trips: list[int] = []
    at_ending: list[int] = []
    scripts_sent: list[list[str]] = []
    real_finished, real_send = endings.finished, group_commit.send

    def finished(*args: Any, **kwargs: Any) -> None:
        at_ending.append(whole["redis round trips"])
        with _counting() as counts:
            real_finished(*args, **kwargs)
        trips.append(counts["redis round trips"])

    def send(client: Any, calls: Any) -> list[Any]:
        scripts_sent.append([_name(c) for c in calls])
        return real_send(client, calls)

    monkeypatch.setattr(endings, "finished", finished)
    monkeypatch.setattr(group_commit, "send", send)
    # The ending's own round trips: a user's on_finished hook (a test app's, if one is imported) may make more.
    monkeypatch.setattr(hooks, "finished", lambda *_args: None)
    # Fault points ask Redis whether they are armed when the tests enable them; a worker never does.
    monkeypatch.setattr(faults, "point", lambda *_args: None)
    with _counting() as whole:
        assert _deliver_all(run_id) == "done"
    assert trips == [1], "the slot release, the lease release and the final event share one round trip"
    assert whole["redis round trips"] - at_ending[0] == 1, "the delivery sends no release of its own after it"
    assert redis_client.get(keys.lease(run_id)) is None
    assert _index_entries(redis_client, run_id) == []
    assert not any(redis_client.sismember(k, run_id) for k in redis_client.keys(keys.held_by("*")))
    assert scripts_sent[-1] == ["release_slot", "release", "ZREM", "SREM", "append_event"], (
        "the releases go ahead of the final event")
    assert _slots(redis_client, "u-ride") == [] and redis_client.hget(admission.SLOT_OWNERS, run_id) is None
    assert len(_final_events(redis_client, run_id)) == 1
    row = runs.get_run(run_id)
    newest = redis_client.xrange(keys.events(run_id))[-1][0]
    assert row is not None and row.state == "done" and row.last_event_id != newest, (
        "the final event comes after the terminal write (the row records the event before it)")


def test_a_lost_final_round_trip_leaves_the_slot_and_the_event_to_the_rescues_repair(store, redis_client,
                                                                                     monkeypatch):
    run_id = submit_run("u-lost", QUERY)
    real_send = group_commit.send
    failed: list[list[str]] = []

    def send(client: Any, calls: Any) -> list[Any]:
        names = [_name(c) for c in calls]
        if "release_slot" in names and not failed:
            failed.append(names)
            raise RedisUnavailable("the final round trip is lost")
        return real_send(client, calls)

    monkeypatch.setattr(group_commit, "send", send)
    assert _deliver_all(run_id) != "done", "the final round trip failed after the terminal commit"
    assert failed == [["release_slot", "release", "ZREM", "SREM", "append_event"]]
    assert redis_client.get(keys.lease(run_id)) is None, "the delivery let go of the lease itself"
    [(member, due)] = _index_entries(redis_client, run_id, scores=True)
    assert due <= now_ms(), f"its index entry {member} is due now: the reaper rescues the run on its next tick"
    row = runs.get_run(run_id)
    assert row is not None and row.state == "done", "the terminal write committed before"
    assert _slots(redis_client, "u-lost") == [run_id] and _final_events(redis_client, run_id) == []
    assert deliver(run_id, None, lambda _r, _s: None) == "skipped", "the rescue finds the run ended"
    assert _slots(redis_client, "u-lost") == [], "the repair gave the slot back"
    [final] = _final_events(redis_client, run_id)
    assert '"repaired": true' in final["data"] or '"repaired":true' in final["data"], final


def test_a_lease_the_step_timeout_gave_up_is_not_let_go_with_the_final_event(store, redis_client):
    """As the delivery leaves it (a wedged thread may still be in a write): it runs out by itself."""
    from checkpoints.runs import claim
    from fenced_core.settings import get_settings

    run_id = submit_run("u-timeout", QUERY)
    lease = Lease(run_id, get_settings().lease_ttl_ms)
    assert lease.acquire(None)
    c = claim(run_id, lease.token)
    assert c is not None
    lease.timed_out = True
    sent: list[list[str]] = []

    def emit(eid: str, type_: str, data: Any = None, riders: Any = ()) -> events.Appends:
        sent.append([_name(r) for r in riders])
        return events.Appends(run_id, c.epoch, [], riders_ran=True)  # as if the round trip went

    endings.finished(c, "done", {"answer": "a"}, emit, lease)
    assert sent == [["release_slot"]] and lease.released is False
    assert redis_client.get(keys.lease(run_id)) == lease.token, "left to run out"


def test_the_lease_let_go_with_the_final_event_is_no_longer_renewed(store, redis_client, monkeypatch):
    """The runner stops renewing the lease before the round trip that lets it go: a watchdog renewal right
    after it (before the delivery's own `finally`) must neither count a lost lease nor put back the index
    entry the release removed (the reaper would rescue the ended run)."""
    from fenced_core.settings import get_settings
    from fencing.watchdog import get_watchdog

    run_id = submit_run("u-renew", QUERY)
    watchdog = get_watchdog(get_settings().heartbeat_ms)
    real_finished = endings.finished
    failures: list[int] = []

    def finished(*args: Any, **kwargs: Any) -> None:
        real_finished(*args, **kwargs)
        before = watchdog.renew_failures
        watchdog.renew_all()  # a heartbeat that falls between the ending and the delivery's finally
        failures.append(watchdog.renew_failures - before)

    monkeypatch.setattr(endings, "finished", finished)
    assert _deliver_all(run_id) == "done"
    assert failures == [0], "the renewal did not find the released lease among its own"
    assert redis_client.get(keys.lease(run_id)) is None and _index_entries(redis_client, run_id) == []


def test_the_lease_counts_as_let_go_only_when_its_release_ran(store, redis_client):
    """`released` follows `riders_ran`: where the riders go alone and fail (a Redis Cluster node down), the
    delivery lets go of the lease itself."""
    from checkpoints.runs import claim
    from fenced_core.settings import get_settings

    for ran in (False, True):
        run_id = submit_run(f"u-ran-{ran}", QUERY)
        lease = Lease(run_id, get_settings().lease_ttl_ms)
        assert lease.acquire(None)
        c = claim(run_id, lease.token)
        assert c is not None

        def emit(eid: str, type_: str, data: Any = None, riders: Any = (), ran: bool = ran) -> events.Appends:
            assert "release" in [_name(r) for r in riders]
            return events.Appends(run_id, c.epoch, [], riders_ran=ran)

        endings.finished(c, "done", {"answer": "a"}, emit, lease)
        assert lease.released is ran
