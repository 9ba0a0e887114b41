"""fenced on a real Redis Cluster (3 masters, 3 replicas; tests/cluster_fixture.py starts it).

The Lua and admission suites run again here with `redis_client` on the cluster (every script and pipeline
as fenced sends them), then what only a cluster has: one slot per script, the lease index spread over the
masters, CLIENT LIST over every node, the stream waiter's poll, and cluster errors as RedisUnavailable."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from fencing import events, keys, scripts
from fencing.connection import RedisUnavailable
from fencing.lease import Lease
from tests.cluster_fixture import on_cluster, redis_cluster  # noqa: F401  (fixtures)

# The script and admission suites, collected again in this module, where `redis_client` is the cluster's.
from tests.test_admission import *  # noqa: F403
from tests.test_admission import limits  # noqa: F401  (fixture)
from tests.test_lua import *  # noqa: F403

# Plain-Redis-only assertions of those suites: what a cluster does differently there, and where it is covered.
PLAIN_ONLY = {
    # A cluster pipeline goes to every node it names in parallel: an event append and a release are one
    # round trip per node, not two in all. The flushed-cache recovery itself is tested below.
    "test_pipelines_survive_a_flushed_script_cache_in_one_round_trip",
    # The broker is a plain Redis beside a cluster (never the cluster), so admit.lua counts the queue
    # lists outside the script: tested on one Redis in test_admission, where they can share it.
    "test_global_limit_counts_undelivered_and_admitted_not_sent",
    # Celery's promote runs on the broker, which is never a cluster.
    "test_promoter_moves_the_oldest_large_run_to_the_front",
    "test_promoter_leaves_large_runs_alone_without_a_normal_backlog",
    # Points a client at a closed plain port: the cluster's own unreachable case is below.
    "test_unreachable_redis_refuses",
    # These read the broker's queue lists through `redis_client`: beside a cluster the broker is another
    # (plain) Redis. Their admission half runs above; their broker half is the same code on one Redis.
    "test_refusals_write_nothing",
    "test_insufficient_credits_write_nothing_and_give_the_slot_back",
    "test_large_run_is_not_starved_behind_a_normal_backlog",
}
for _name in PLAIN_ONLY:
    globals().pop(_name, None)


@pytest.fixture
def redis_client(on_cluster: Any) -> Iterator[Any]:  # noqa: F811  (this module's: the cluster)
    yield on_cluster


def test_the_client_is_a_cluster_client(redis_client):
    from fencing.cluster import FencedRedisCluster, is_cluster

    assert isinstance(redis_client, FencedRedisCluster) and is_cluster(redis_client)
    masters = [n for n in redis_client.get_nodes() if n.server_type == "primary"]
    assert len(masters) == 3, masters


# -- one slot per script ------------------------------------------------------------------------------------
def _sample_calls() -> list[scripts.Call]:
    """One call of every script wrapper, with sample arguments (admit as on a cluster: no broker lists)."""
    calls = [
        scripts.acquire("run-a", token="t", ttl_ms=1, handoff=""),
        scripts.renew("run-a", token="t", ttl_ms=1),
        scripts.release("run-a", token="t", handoff="", handoff_ttl_ms=1),
        scripts.release_prefix("run-a", prefix="p"),
        scripts.raise_epoch("run-a", epoch=1),
        scripts.append_event("run-a", epoch=1, maxlen=10, fields=["a", "b"]),
        scripts.rescue("run-a", grace_ms=1, rescuer="r"),
        scripts.pop_expired(member=keys.index_member("run-a", "t"), now_ms=1),
        scripts.fault_hit(point="p", hit="h"),
        scripts.admit(unsent_key=keys.ADMITTED_UNSENT, user_slots_key=keys.user_slots("u"),
                      slot_owners_key=__import__("fencing.admission", fromlist=["SLOT_OWNERS"]).SLOT_OWNERS,
                      queue_keys=[], run_id="run-a", now_ms=1, max_queued=1, max_per_user=1, slot_ttl_ms=1,
                      unsent_ttl_ms=1, outside_backlog=0, user_id="u"),
        __import__("fencing.admission", fromlist=["release_call"]).release_call("u", "run-a"),
    ]
    return calls


def test_every_script_touches_one_slot():
    """Each script's KEYS hash to one slot, so a Redis Cluster runs it on one node. promote.lua is the one
    exception, by design: it moves between two broker lists, and the broker is never a cluster."""
    calls = _sample_calls()
    covered = {c.script for c in calls} | {"promote"}
    assert covered == set(scripts.Scripts.NAMES), "a new script needs its sample call here"
    for call in calls:
        slots = {key_slot(k.encode()) for k in call.keys}
        assert len(slots) == 1, f"{call.script}: keys {call.keys} span slots {slots}"


def test_the_lease_index_is_spread_over_every_master(redis_client):
    """The reaper's index is LEASE_INDEX_SHARDS keys with their own hash tags: no one hot slot, and every
    master holds some; a run's entries all sit in its own shard."""
    nodes = {redis_client.get_node_from_key(index).name for index in keys.LEASE_INDEXES}
    assert len(nodes) == 3, nodes
    runs = [f"spread-{i}" for i in range(200)]
    assert len({keys.lease_index(r) for r in runs}) == keys.LEASE_INDEX_SHARDS
    lease = Lease("spread-0", 5000)
    assert lease.acquire(0)
    assert redis_client.zscore(keys.lease_index("spread-0"), lease.member) is not None
    assert all(redis_client.zcard(i) == 0 for i in keys.LEASE_INDEXES if i != keys.lease_index("spread-0"))


def test_the_reaper_reads_every_shard(redis_client):
    """Leases that ran out in runs spread over every shard (and so every master) are all rescued once."""
    from fencing import reaper

    runs = [f"reap-{i}" for i in range(40)]
    assert len({keys.lease_index(r) for r in runs}) > 8
    for run_id in runs:
        assert Lease(run_id, 100).acquire(0)
    time.sleep(0.25)
    sent: list[str] = []
    assert sorted(reaper.reap(sent.append, 2000)) == sorted(runs) == sorted(sent)
    assert reaper.reap(sent.append, 2000) == [], "a rescue goes out once"


def test_a_flushed_script_cache_is_reloaded_on_every_master(redis_client):
    """SCRIPT FLUSH on every master (a restart, a promoted replica that never loaded them): the next
    pipelined scripts fail with NOSCRIPT, are loaded and sent again, changing nothing twice."""
    from fencing import epoch

    a = Lease("flushed", 5000)
    assert a.acquire(0)
    epoch.raise_epoch("flushed", 1)
    redis_client.script_flush()
    events.append("flushed", 1, "e1", "step_started", 0, {})
    assert a.release(1)
    assert [e.eid for e in events.read("flushed")] == ["e1"], "a retried pipeline must not append twice"
    assert redis_client.get(keys.lease("flushed")) == "handoff:1"


# -- liveness: connections on every node --------------------------------------------------------------------
def test_connected_names_come_from_every_node(redis_client):
    """A process's named connections are spread over the nodes it talked to; CLIENT LIST on one node
    would miss a process connected only elsewhere, and fast takeover would presume it dead."""
    import redis

    from fencing.connection import connected_names

    other = next(n for n in redis_client.get_nodes()
                 if n.server_type == "primary" and n.name != redis_client.get_default_node().name)
    probe = redis.Redis(host=other.host, port=other.port, client_name="fenced:probe-elsewhere")
    try:
        probe.ping()
        assert "fenced:probe-elsewhere" not in {c.get("name") for c in redis_client.client_list()}, \
            "the default node alone does not list it"
        assert "fenced:probe-elsewhere" in connected_names(redis_client)
    finally:
        probe.close()


def test_a_dead_process_is_presumed_dead_and_its_runs_rescued(redis_client, monkeypatch):
    from fenced_core.settings import get_settings
    from fencing import liveness

    monkeypatch.setenv("FENCED_FAST_TAKEOVER", "1")
    get_settings.cache_clear()
    dead = "gone-host:1:dead"
    runs = [f"dead-{i}" for i in range(6)]
    for run_id in runs:
        assert Lease(run_id, 60_000, token=f"{dead}/{run_id}").acquire(0)
    sent: list[str] = []
    for _ in range(liveness.MISSES_TO_PRESUME_DEAD):
        redis_client.delete(keys.LIVENESS_LOCK)
        rescued = liveness.check_connections(sent.append)
    assert sorted(rescued) == sorted(runs) == sorted(sent)
    assert not any(redis_client.exists(keys.lease(r)) for r in runs)


def test_a_batch_of_rescues_marks_them_under_way_and_a_renewal_reads_the_mark(redis_client, monkeypatch):
    """The mark a batch of rescues sets rides in rescue_many's pipeline, and the inline-step check reads
    it with the renewal: both pipelines span slots on a cluster (tasks.delivery._goes_on)."""
    from fenced_core.settings import get_settings
    from fencing import liveness
    from fencing.reaper import RESCUE_YIELD_MIN_RUNS

    monkeypatch.setenv("FENCED_FAST_TAKEOVER", "1")
    get_settings.cache_clear()
    dead = "gone-host:2:dead"
    runs = [f"batch-{i}" for i in range(RESCUE_YIELD_MIN_RUNS)]
    for run_id in runs:
        assert Lease(run_id, 60_000, token=f"{dead}/{run_id}").acquire(0)
    alive = Lease("alive-run", 60_000)
    assert alive.acquire(0)
    assert alive.renew(exists=keys.RESCUES_UNDER_WAY) == (True, 0)
    for _ in range(liveness.MISSES_TO_PRESUME_DEAD):
        redis_client.delete(keys.LIVENESS_LOCK)
        rescued = liveness.check_connections(lambda _run_id: None)
    assert sorted(rescued) == sorted(runs)
    assert redis_client.exists(keys.RESCUES_UNDER_WAY)
    assert alive.renew(exists=keys.RESCUES_UNDER_WAY) == (True, 1)


# -- live events: the poll that stands in for one XREAD over many slots -------------------------------------
def test_the_stream_waiter_follows_runs_on_every_master(redis_client):
    runs = [f"live-{i}" for i in range(12)]
    assert len({redis_client.get_node_from_key(keys.events(r)).name for r in runs}) == 3
    waiter = events.StreamWaiter(max_block_ms=2_000)
    try:
        assert waiter.read({r: "0" for r in runs}, 200) == {}, "nothing appended yet"
        for i, run_id in enumerate(runs):
            events.append(run_id, 1, f"e{i}", "step_started", 0, {"i": i})
        got = waiter.read({r: "0" for r in runs}, 200)
        assert {r: [e.eid for e in evs] for r, evs in got.items()} == {r: [f"e{i}"] for i, r in enumerate(runs)}
        positions = {r: evs[-1].stream_id for r, evs in got.items()}
        assert waiter.read(positions, 100) == {}, "positions are exclusive"

        def later() -> None:
            time.sleep(0.3)
            events.append(runs[5], 1, "late", "step_started", 0, {})

        threading.Thread(target=later).start()
        got = waiter.read(positions, 1_500)
        assert [e.eid for e in got[runs[5]]] == ["late"]
        # wake() ends a wait early: the hub adds a run to watch at once.
        threading.Timer(0.2, waiter.wake).start()
        started = time.monotonic()
        assert waiter.read({r: positions[r] for r in runs if r != runs[5]}, 1_800) == {}
        assert time.monotonic() - started < 1.5, "woken, the wait returned before its block ran out"
    finally:
        waiter.close()


def test_the_overview_tail_reads_across_slots(redis_client):
    from fencing import overview

    runs = [f"tail-{i}" for i in range(6)]
    for i, run_id in enumerate(runs):
        events.append(run_id, 1, f"t{i}", "step_started", 0, {})
    found = overview.tail({r: "0-0" for r in runs}, 100)
    assert {r: [e.eid for e in evs] for r, evs in found.items()} == {r: [f"t{i}"] for i, r in enumerate(runs)}


# -- errors ------------------------------------------------------------------------------------------------
def test_an_unreachable_cluster_is_redis_unavailable():
    from fencing.connection import client_for

    with pytest.raises(RedisUnavailable, match="Redis Cluster unavailable"):
        client_for("redis+cluster://127.0.0.1:1,127.0.0.1:2", socket_connect_timeout=0.2, socket_timeout=0.2)


def test_a_cross_slot_command_is_a_bug_not_an_outage(redis_client):
    import redis
    from redis.exceptions import RedisClusterException

    with pytest.raises((redis.RedisError, RedisClusterException)) as caught:
        redis_client.execute_command("SUNIONSTORE", "{a}x", "{b}y")
    assert not isinstance(caught.value, RedisUnavailable), caught.value


def test_a_cluster_url_names_its_nodes_and_credentials():
    from fencing.cluster import nodes_of

    assert nodes_of("redis+cluster://127.0.0.1:7000,h2:7001") == ([("127.0.0.1", 7000), ("h2", 7001)], {})
    assert nodes_of("redis+cluster://u:p%40ss@h:1/0") == ([("h", 1)], {"username": "u", "password": "p@ss"})
    with pytest.raises(ValueError, match="names no node"):
        nodes_of("redis+cluster://")


def test_module_runs_the_shared_suites():
    """The suites imported above are collected here (a rename there must not silently drop them)."""
    here = {n for n, f in globals().items() if n.startswith("test_") and inspect.isfunction(f)}
    assert "test_acquire_is_exclusive_and_release_is_compare_and_delete" in here
    assert "test_admits_up_to_the_user_limit_then_refuses" in here


# -- transactions: only ever within one slot -----------------------------------------------------------------
def test_the_registrys_transactions_stay_in_one_slot(redis_client):
    """The worker registry's MULTI/EXEC pipelines touch only {routing}-tagged keys: on a cluster they run
    as transactions on one node (redis-py refuses a cross-slot one)."""
    from fencing import registry

    registry.beat("w1", {"queue": "q-w1", "concurrency": 2})
    [record] = registry.all_workers()
    assert (record.name, record.status, record.concurrency) == ("w1", "online", 2)
    registry.routed("w1", "run-x", 3)
    assert registry.mark_offline("w1", "gone") == [registry.pending_member("run-x", 3)]
    assert registry.mark_offline("w1", "gone") is None, "offline already"
    registry.routed("w1", "run-y", None)
    assert registry.take_pending("w1") == [registry.pending_member("run-y", None)]
    registry.defer("run-z", {"step": 1})
    assert registry.deferred(10) == [("run-z", {"step": 1})]
    registry.undefer(["run-z"])
    assert registry.deferred_count() == 0
    registry.forget("w1")
    assert registry.all_workers() == []


def test_pipelined_scripts_go_one_round_trip_per_node(redis_client, monkeypatch):
    """A cluster pipeline cannot read an EVALSHA's keys: unrouted, each script went to some node, came back
    MOVED and was sent again alone (found by bench.cluster_ticks: 1,003 round trips to renew 1,000 leases).
    Routed by their first key, one watchdog renewal is one round trip per master."""
    import redis.connection

    from fencing.watchdog import Watchdog

    leases = [Lease(f"trip-{i}", 30_000) for i in range(60)]
    wd = Watchdog(heartbeat_ms=10_000)
    for lease in leases:
        assert lease.acquire(0)
        wd.track(lease)
    trips: list[bytes] = []
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self, command, check_health=True):
        trips.append(command)
        return original(self, command, check_health)

    with monkeypatch.context() as m:
        m.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
        wd.renew_all()
    assert not any(lease.lost for lease in leases)
    assert len(trips) <= 3, f"60 renewals on 3 masters: {len(trips)} round trips"


def test_a_slot_release_goes_before_the_final_event_on_a_cluster(redis_client, limits, monkeypatch):  # noqa: F811
    """A cluster pipeline orders nothing across nodes, and the admission keys live on another slot than the
    run's stream: the release riding with a final event goes first, in a round trip of its own, so a client
    that sees the event still finds the slot free (on one Redis both share one round trip: test_admission)."""
    from fencing import admission, group_commit

    limits(max_runs_per_user=1)
    admission.admit("ride-c", "uc", [])
    piped: list[list[str]] = []
    real = group_commit.send
    monkeypatch.setattr(group_commit, "send", lambda client, calls: piped.append([c.script for c in calls])
                        or real(client, calls))
    appends = events.Appends("ride-c", 0, [("run:done", "run_done", 3, {})])
    appends.send(client=redis_client, riders=[admission.release_call("uc", "ride-c")])
    assert piped == [["append_event"]], "the release went alone, before the append's round trip"
    assert redis_client.zcard(keys.user_slots("uc")) == 0 and len(redis_client.xrange(keys.events("ride-c"))) == 1


def test_a_lease_released_with_the_final_event_goes_alone_first_on_a_cluster(redis_client, limits, monkeypatch):  # noqa: F811
    """The lease, the reaper's index shard and the process's set live on three slots: on a cluster the lease
    release riding with a final event goes ahead of it in a round trip of its own (each part routed to
    its node), and `riders_ran` says it went, so the delivery sends no second one."""
    from fencing import admission, group_commit
    from fencing.lease import Lease

    limits(max_runs_per_user=1)
    admission.admit("ride-l", "ul", [])
    lease = Lease("ride-l", 30_000)
    assert lease.acquire(None, client=redis_client)
    piped: list[list[str]] = []
    real = group_commit.send
    monkeypatch.setattr(group_commit, "send", lambda client, calls: piped.append([c.script for c in calls])
                        or real(client, calls))
    appends = events.Appends("ride-l", 0, [("run:done", "run_done", 3, {})])
    appends.send(client=redis_client, riders=[admission.release_call("ul", "ride-l"), *lease.release_calls()])
    assert piped == [["append_event"]], "the releases went alone, before the append's round trip"
    assert appends.riders_ran
    assert redis_client.get(keys.lease("ride-l")) is None
    assert [m for m in redis_client.zrange(keys.lease_index("ride-l"), 0, -1) if m.endswith("|ride-l")] == []
    assert not redis_client.sismember(keys.held_by(lease.process), "ride-l")
    assert redis_client.zcard(keys.user_slots("ul")) == 0 and len(redis_client.xrange(keys.events("ride-l"))) == 1
