"""A run's ending in one Redis round trip fewer (issue 17): the user's slot goes back in the final event's
round trip, ahead of the append (release_slot.lua riding with append_event.lua), so a client that sees the
final event finds the slot free; a round trip that fails leaves both to the repair that the rescue's
delivery makes. In-process deliveries on both stores."""

from __future__ import annotations

from typing import Any

import examples.shopping  # noqa: F401 - registers the demo agent the deliveries run
from bench.step_counts import _counting
from checkpoints import runs
from fencing import admission, group_commit, keys
from fencing.connection import RedisUnavailable
from tasks import endings, hooks, submit_run
from tasks.delivery import deliver

QUERY = "wireless headphones under $100"


def _slots(redis_client: Any, user_id: str) -> list[str]:
    return list(redis_client.zrange(keys.user_slots(user_id), 0, -1))


def _final_events(redis_client: Any, run_id: str) -> list[dict[str, str]]:
    return [fields for _id, fields in redis_client.xrange(keys.events(run_id)) if fields.get("eid") == "run:done"]


def _deliver_all(run_id: str) -> str:
    sent: list[int] = [0]
    while (outcome := deliver(run_id, sent[-1], lambda _r, s: sent.append(s))) == "continue":
        pass
    return outcome


def test_the_slot_release_rides_ahead_of_the_final_event_in_one_round_trip(store, redis_client, monkeypatch):
    run_id = submit_run("u-ride", QUERY)
    assert _slots(redis_client, "u-ride") == [run_id]
    trips: list[int] = []
    scripts_sent: list[list[str]] = []
    real_finished, real_send = endings.finished, group_commit.send

    def finished(*args: Any, **kwargs: Any) -> None:
        with _counting() as counts:
            real_finished(*args, **kwargs)
        trips.append(counts["redis round trips"])

    def send(client: Any, calls: Any) -> list[Any]:
        scripts_sent.append([c.script for c in calls])
        return real_send(client, calls)

    monkeypatch.setattr(endings, "finished", finished)
    monkeypatch.setattr(group_commit, "send", send)
    # The ending's own round trips: a user's on_finished hook (a test app's, if one is imported) may make more.
    monkeypatch.setattr(hooks, "finished", lambda *_args: None)
    assert _deliver_all(run_id) == "done"
    assert trips == [1], "the slot release and the final event share one round trip"
    assert scripts_sent[-1] == ["release_slot", "append_event"], "the release goes ahead of the final event"
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
        names = [c.script for c in calls]
        if "release_slot" in names and not failed:
            failed.append(names)
            raise RedisUnavailable("the final round trip is lost")
        return real_send(client, calls)

    monkeypatch.setattr(group_commit, "send", send)
    assert _deliver_all(run_id) != "done", "the final round trip failed after the terminal commit"
    assert failed == [["release_slot", "append_event"]]
    row = runs.get_run(run_id)
    assert row is not None and row.state == "done", "the terminal write committed before"
    assert _slots(redis_client, "u-lost") == [run_id] and _final_events(redis_client, run_id) == []
    assert deliver(run_id, None, lambda _r, _s: None) == "skipped", "the rescue finds the run ended"
    assert _slots(redis_client, "u-lost") == [], "the repair gave the slot back"
    [final] = _final_events(redis_client, run_id)
    assert '"repaired": true' in final["data"] or '"repaired":true' in final["data"], final
