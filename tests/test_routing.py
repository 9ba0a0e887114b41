"""Reachability routing (issue 14): the score, the policy, the scan, and real workers slowed, frozen and killed.

The worker tests use short intervals (heartbeat 0.5 s, scan 0.25 s: offline after 3 x 0.5 + 0.5 = 2 s
instead of 15.5 s) so they run in seconds; the logic is the same at the defaults."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter

import pytest
import sqlalchemy as sa

from checkpoints import ledger
from checkpoints.db import transaction
from checkpoints.schema import run_ledger
from fenced_core.settings import get_settings
from fencing import registry
from fencing.connection import get_redis
from fencing.registry import WorkerRecord
from routing import policy, scan
from routing.score import candidate
from tasks import submit_run, wakeup
from tests.extras import require_extra
from tests.workers_fixture import wait_for, wait_terminal

FAST = {"routing": "reach", "routing_heartbeat_ms": 500, "routing_scan_ms": 250}


def _record(name: str, age_ms: int = 0, avg_ms: float | None = None, rate: float | None = None, running: int = 0,
            queued: int = 0, queue: str = "q", status: str = "online", concurrency: int = 4) -> WorkerRecord:
    fields = {"queue": queue, "status": status, "running": str(running), "concurrency": str(concurrency),
              "avg_step_ms": "" if avg_ms is None else str(avg_ms), "success_rate": "" if rate is None else str(rate)}
    return WorkerRecord(name, registry.now_ms() - age_ms, fields, queued)


def test_score_is_the_weighted_sum_of_its_four_factors(settings_env):
    settings_env(routing_heartbeat_ms=5000)
    s = get_settings()
    now = registry.now_ms()
    c = candidate(_record("w", avg_ms=500, rate=0.9, running=1, queued=1), now, s)
    assert c.freshness == pytest.approx(1.0, abs=0.01)
    assert (c.speed, c.load, c.success) == (pytest.approx(1 / 1.5), pytest.approx(1 / 3), 0.9)
    assert c.score == pytest.approx(0.3 * c.freshness + 0.2 / 1.5 + 0.3 / 3 + 0.2 * 0.9)
    stale = candidate(_record("w", age_ms=15_000), now, s)
    assert stale.freshness < 0.06, "near 0 at 15 s (3 heartbeat periods)"
    assert candidate(_record("w", running=0), now, s).score > candidate(_record("w", running=3), now, s).score
    settings_env(routing_heartbeat_ms=5000, routing_load_per_slot=1)
    per_slot = candidate(_record("w", running=1, queued=1, concurrency=4), now, get_settings())
    assert per_slot.load == pytest.approx(1 / 1.5), "2 in flight on 4 slots"


def test_threshold_status_and_own_queue_decide_who_qualifies(settings_env):
    settings_env(routing_threshold=0.9)
    s = get_settings()
    now = registry.now_ms()
    assert not candidate(_record("w", running=5), now, s).qualified  # 0.3+0.2+0.05+0.2 = 0.75 < 0.9
    settings_env(routing_threshold=0.3)
    s = get_settings()
    assert candidate(_record("w"), now, s).qualified
    assert candidate(_record("w", status="draining"), now, s).why_not == "draining"
    assert "no queue of its own" in candidate(_record("w", queue=""), now, s).why_not


def _beat(name: str, *, queue: bool = True, running: int = 0, avg_ms: float | None = None,
          concurrency: int = 4) -> None:
    registry.beat(name, {"queue": policy.queue_of(name) if queue else "", "concurrency": concurrency,
                         "running": running, "avg_step_ms": "" if avg_ms is None else avg_ms, "success_rate": ""})


def test_choose_picks_the_best_and_keeps_the_previous_worker_while_it_has_room(redis_client, settings_env):
    settings_env(routing="reach")
    _beat("slow@h", avg_ms=3000)
    _beat("fast@h", avg_ms=300)
    d = policy.choose()
    assert d.worker == "fast@h" and [c.worker for c in d.candidates] == ["fast@h", "slow@h"]
    assert "routed to fast@h" in d.sentence() and "next: slow@h" in d.sentence()
    # A continuation stays on its worker while it has a free slot once its step ends and scores within
    # the margin of the best (its own step counted as ended)...
    _beat("warm@h", avg_ms=400, running=1, concurrency=1)
    kept = policy.choose(prefer="warm@h")
    assert kept.worker == "warm@h" and kept.kept_preferred and "still qualifies" in kept.sentence()
    # ...and goes elsewhere when it is full (overloaded), clearly slower, or not qualified (draining).
    _beat("warm@h", avg_ms=400, running=2, concurrency=1)
    assert policy.choose(prefer="warm@h").worker == "fast@h"
    _beat("slow@h", avg_ms=3000, running=1, concurrency=4)
    assert policy.choose(prefer="slow@h").worker == "fast@h"
    _beat("warm@h", avg_ms=400, running=1, concurrency=1)
    registry.set_status("warm@h", "draining")
    moved = policy.choose(prefer="warm@h")
    assert moved.worker == "fast@h" and "passed over (draining)" in moved.sentence()
    # Runs in flight = running + routed and not yet consumed: 2 queued weigh more than 1 running.
    for name in ("fast@h", "slow@h", "warm@h"):
        registry.forget(name)
    _beat("a@h")
    _beat("b@h", running=1)
    registry.routed("a@h", "r1", None)
    registry.routed("a@h", "r2", 3)
    assert policy.choose().worker == "b@h"


def test_a_worker_fast_takeover_presumed_dead_gets_no_rescue_and_goes_offline_at_once(redis_client, settings_env):
    """A killed holder is presumed dead by fast takeover (every liveness tick) before the routing scan
    sees its connections gone twice: the rescue fast takeover sends must not be routed back to it (it
    was, in the chaos kill scenario under reach: 1-2 s more per takeover, p95 over its 3 s bound)."""
    from fencing import keys

    settings_env(routing="reach")
    client = get_redis()
    registry.beat("dead@h", {"queue": policy.queue_of("dead@h"), "concurrency": 4, "token": "h:1:dead"})
    registry.beat("busy@h", {"queue": policy.queue_of("busy@h"), "concurrency": 4, "token": "h:2:busy",
                             "running": 3})
    assert policy.choose().worker == "dead@h", "idle: the best, until it is presumed dead"
    client.zadd(keys.PRESUMED_DEAD, {"h:1:dead": registry.now_ms() + 1})
    d = policy.choose()
    dead = next(c for c in d.candidates if c.worker == "dead@h")
    assert d.worker == "busy@h" and not dead.qualified and dead.why_not.startswith("presumed dead"), d.sentence()
    out = scan.scan(_resend, force=True)  # first scan without its connection: offline now, not after two
    assert "dead@h" in out.offline
    assert "presumed dead" in client.hget(registry.worker("dead@h"), "offline_reason")
    # A live process presumed dead by mistake beats again: the beat is newer than the presumption.
    client.zadd(keys.PRESUMED_DEAD, {"h:2:busy": registry.now_ms() - 10})
    registry.beat("busy@h", {"queue": policy.queue_of("busy@h"), "concurrency": 4, "token": "h:2:busy"})
    assert policy.choose().worker == "busy@h"


def test_shared_policy_sends_as_before(mysql_store, settings_env):
    settings_env(routing="shared")
    run_id = submit_run("u1", "buy headphones")
    client = get_redis()
    assert client.llen("agents") == 1
    assert not [e for e in ledger.history(run_id) if e.kind == "routed"]
    assert not client.keys("fenced:{routing}:pending:*")


def test_nobody_qualifies_defers_without_a_message_and_the_scan_routes_it_later(mysql_store, settings_env):
    settings_env(routing="reach")
    client = get_redis()
    run_id = submit_run("u1", "buy headphones")
    assert client.llen("agents") == 0 and client.llen("agents.continue") == 0, "no message anywhere"
    assert registry.deferred(10)[0][0] == run_id
    [entry] = [e for e in ledger.history(run_id) if e.kind == "routed"]
    assert entry.detail["worker"] is None and "deferred" in entry.reason and entry.epoch == 0
    # Still nobody: the scan leaves it deferred and writes nothing more.
    scan.scan(_resend, force=True)
    assert registry.deferred_count() == 1 and len([e for e in ledger.history(run_id) if e.kind == "routed"]) == 1
    _beat("w1@h")
    out = scan.scan(_resend, force=True)
    assert out.routed_deferred == [run_id] and registry.deferred_count() == 0
    assert client.llen(policy.queue_of("w1@h")) == 1
    routed = [e for e in ledger.history(run_id) if e.kind == "routed"]
    assert routed[-1].detail["worker"] == "w1@h" and routed[-1].detail["candidates"][0]["worker"] == "w1@h"
    assert {"score", "freshness", "speed", "load", "success"} <= set(routed[-1].detail["candidates"][0])


def _resend(run_id: str, step: int | None, reason: str, kind: str) -> None:
    wakeup.send(run_id, step, reason, kind=kind)  # type: ignore[arg-type]


def test_a_worker_without_heartbeats_goes_offline_and_its_queued_wakeups_go_elsewhere(mysql_store, settings_env):
    settings_env(routing="reach", routing_heartbeat_ms=500)
    client = get_redis()
    _beat("dead@h")
    run_id = submit_run("u1", "buy headphones")
    assert client.llen(policy.queue_of("dead@h")) == 1
    _beat("live@h", running=3)  # busier, but alive
    client.zadd(registry.WORKERS, {"dead@h": registry.now_ms() - scan.offline_after_ms() - 1})
    out = scan.scan(_resend, force=True)
    assert out.offline == ["dead@h"] and out.rerouted == [run_id]
    assert client.hget(registry.worker("dead@h"), "status") == "offline"
    # A reroute is not a first wake-up: it waits in the queue the worker consumes before its new runs.
    assert client.llen(registry.urgent_queue(policy.queue_of("live@h"))) == 1
    assert client.llen(policy.queue_of("live@h")) == 0
    assert policy.choose().worker == "live@h", "an offline worker gets nothing"
    last = [e for e in ledger.history(run_id) if e.kind == "routed"][-1]
    assert last.detail["reason"] == "reroute" and last.detail["worker"] == "live@h"
    assert "dead@h" in last.reason and "offline)" in last.reason
    assert registry.feed()[0]["kind"] == "worker_offline"


def test_a_long_queue_warns_once_on_the_feed(redis_client, settings_env):
    settings_env(routing_queue_warn=2)
    client = get_redis()
    for i in range(3):
        client.lpush("agents", json.dumps({"headers": {"fenced_sent_ms": registry.now_ms() - 1000 * (3 - i)}}))
    out = scan.scan(_resend, ["agents"], force=True)
    assert out.warnings == ["agents"]
    warning = registry.feed()[0]
    assert warning["kind"] == "queue_long" and warning["length"] == "3" and int(warning["lag_ms"]) >= 2900
    assert scan.scan(_resend, ["agents"], force=True).warnings == [], "once a minute, not every scan"


def test_a_long_queue_clears_once_drained_and_warns_again_on_the_next_crossing(redis_client, settings_env):
    settings_env(routing_queue_warn=4)
    client = get_redis()
    for _ in range(5):
        client.lpush("agents", json.dumps({"headers": {"fenced_sent_ms": registry.now_ms()}}))
    assert scan.scan(_resend, ["agents"], force=True).warnings == ["agents"]
    assert registry.queues_long().keys() == {"agents"}
    # A watcher that read the marks just before this one marked it: its raise finds the mark, says nothing.
    assert registry.queue_long_raise("agents", {"kind": "queue_long", "queue": "agents"}) is False
    assert registry.queue_warnings() == {"agents": 1}
    client.rpop("agents", 1)  # 4: at the threshold, over 3/4 of it: still long (no flapping)
    scan.scan(_resend, ["agents"], force=True)
    assert registry.feed()[0]["kind"] == "queue_long" and registry.queues_long().keys() == {"agents"}
    client.rpop("agents", 1)  # 3: cleared
    scan.scan(_resend, ["agents"], force=True)
    cleared = registry.feed()[0]
    assert (cleared["kind"], cleared["queue"], cleared["length"]) == ("queue_ok", "agents", "3")
    assert registry.queues_long() == {}
    for _ in range(2):
        client.lpush("agents", json.dumps({"headers": {"fenced_sent_ms": registry.now_ms()}}))
    assert scan.scan(_resend, ["agents"], force=True).warnings == ["agents"], "a new crossing warns again"
    assert registry.queue_warnings() == {"agents": 2}


def test_under_reach_admission_counts_the_workers_own_queues_and_the_deferred_runs(mysql_store, settings_env):
    """The global backlog (max_queued_runs) counts where first wake-ups wait: the shared queues under
    `shared`; under `reach` the own queue of every worker not offline and the deferred wake-ups."""
    from fenced_core.errors import AdmissionRefused

    settings_env(routing="reach", max_queued_runs=3, max_runs_per_user=100)
    client = get_redis()
    deferred = [submit_run(f"d{i}", "buy headphones") for i in range(3)]  # nobody registered: all deferred
    assert registry.deferred_count() == 3 and client.llen("agents") == 0
    with pytest.raises(AdmissionRefused) as refused:
        submit_run("d3", "buy headphones")
    assert refused.value.limit == "global" and "3 runs are waiting" in str(refused.value)
    registry.undefer(deferred)  # as if the scan had routed them and a worker had taken them
    _beat("w1@h")
    routed = [submit_run(f"r{i}", "buy headphones") for i in range(3)]
    assert client.llen(policy.queue_of("w1@h")) == 3
    with pytest.raises(AdmissionRefused):
        submit_run("r3", "buy headphones")
    # A worker gone offline: its leftovers were rerouted, its queue is stale, not waiting.
    client.zadd(registry.WORKERS, {"w1@h": registry.now_ms() - scan.offline_after_ms() - 1})
    _beat("w2@h")
    assert submit_run("r4", "buy headphones") not in routed


# -- real workers --------------------------------------------------------------------------------------

def _routed(run_ids: list[str]) -> list[ledger.Entry]:
    return [e for r in run_ids for e in ledger.history(r) if e.kind == "routed"]


def _first_worker(run_ids: list[str]) -> Counter[str]:
    """Which worker each run's first (submit) wake-up was routed to."""
    return Counter(e.detail["worker"] for e in _routed(run_ids) if e.detail["reason"] == "submit")


def _explained(entries: list[ledger.Entry]) -> None:
    for e in entries:
        cands = e.detail["candidates"]
        assert cands and all({"worker", "score", "freshness", "speed", "load", "success"} <= set(c) for c in cands)
        if e.detail["worker"]:
            assert f"routed to {e.detail['worker']}" in e.reason
            best = max((c for c in cands if c["qualified"]), key=lambda c: c["score"])
            assert e.detail["kept_preferred"] or best["worker"] == e.detail["worker"], e.detail


def test_a_slowed_worker_receives_clearly_fewer_runs(workers, settings_env):
    # The tuning docs/routing.md measures (load per slot, speed weighed over load): with the issue's
    # default weights the slowed worker got 3-7 of 30 runs, and this check failed about one run in three.
    settings_env(**FAST, max_runs_per_user=100, routing_load_per_slot=True, routing_w_speed=0.6, routing_w_load=0.2)
    workers.start("f1")
    workers.start("f2")
    workers.start("slow", FENCED_STUB_STEP_MS="1000")  # 5 x the others' 200 ms
    warm = [submit_run(f"warm{i}", "buy headphones") for i in range(6)]
    wait_terminal(warm, timeout=60)
    ids = []
    for i in range(30):
        ids.append(submit_run(f"u{i}", "buy headphones"))
        time.sleep(0.2)
    wait_terminal(ids, timeout=120)
    got = _first_worker(ids)
    fast = [n for n in got if not n.startswith("slow")]
    slow = sum(v for n, v in got.items() if n.startswith("slow"))
    print("runs per worker:", dict(got))
    assert sum(got.values()) == 30
    assert slow * 2 < min(got[n] for n in fast), got
    _explained(_routed(ids))


def test_a_frozen_worker_receives_nothing_once_offline_and_every_run_finishes(workers, settings_env):
    settings_env(**FAST)
    workers.start("a")
    frozen = workers.start("b")
    node = wait_for(lambda: next((w.name for w in registry.all_workers() if w.name.startswith("b@")), None), 10,
                    "b to register")
    early = [submit_run(f"e{i}", "buy headphones") for i in range(4)]
    frozen.kill(signal.SIGSTOP)
    try:
        last_beat = int(get_redis().zscore(registry.WORKERS, node))
        offline_at = last_beat + scan.offline_after_ms()
        ids = []
        for i in range(20):
            ids.append(submit_run(f"u{i}", "buy headphones"))
            time.sleep(0.2)
        wait_terminal(early + ids, timeout=90)
        late = [e for e in _routed(early + ids) if e.at_ms > offline_at + 300]
        assert late, "decisions were made after the offline bound"
        assert all(e.detail["worker"] != node for e in late), [e.reason for e in late if e.detail["worker"] == node]
        assert get_redis().hget(registry.worker(node), "status") == "offline"
        _explained(_routed(early + ids))
    finally:
        frozen.kill(signal.SIGCONT)


def test_every_run_routed_to_a_killed_worker_finishes(workers, settings_env):
    settings_env(**FAST, max_runs_per_user=100)
    workers.start("a")
    workers.start("b")
    victim = workers.start("c", concurrency=2)
    ids = [submit_run(f"u{i}", "buy headphones") for i in range(16)]
    node = wait_for(lambda: next((w for w in registry.all_workers() if w.name.startswith("c@")
                                  and w.running + w.queued >= 2), None), 20, "runs routed to c").name
    routed_to_victim = {e.run_id for e in _routed(ids) if e.detail["worker"] == node}
    victim.kill(signal.SIGKILL)
    killed_at = registry.now_ms()
    runs_ = wait_terminal(ids, timeout=90)
    assert all(r.state == "done" for r in runs_), [(r.run_id, r.state) for r in runs_]
    assert routed_to_victim
    status = get_redis().hgetall(registry.worker(node))
    assert status["status"] == "offline"
    switch_ms = int(status["offline_ms"]) - killed_at
    print(f"kill -9 to offline: {switch_ms} ms ({status['offline_reason']})")
    assert switch_ms < 2000 and "no Redis connection" in status["offline_reason"], status
    after = [e for e in _routed(ids) if e.at_ms > int(status["offline_ms"])]
    assert all(e.detail["worker"] != node for e in after)
    _explained(_routed(ids))
    from tasks.explain import explain

    why = explain(sorted(routed_to_victim)[0]).answer("routed")
    assert why is not None and any(f"routed to {node}" in s for s in why.sentences), why


@pytest.mark.chaos
@pytest.mark.parametrize("name", ["kill", "zombie"])
def test_chaos_scenario_passes_under_reach(name, mysql_store, tmp_path, settings_env):
    """The chaos suite's kill and zombie scenarios at CI scale with FENCED_ROUTING=reach in the workers
    (they inherit this process's environment) and in this process (the scenarios submit from here)."""
    from dataclasses import replace

    from chaos.harness import ChaosConfig
    from chaos.report import percentile
    from chaos.scenarios import bounds, run
    from tests.test_chaos import CFG, REDUCED

    settings_env(**FAST)
    cfg = replace(ChaosConfig(lease_ms=2000, step_ms=300, tool_ms=200, log_dir=tmp_path), **CFG.get(name, {}))
    result = run(name, cfg, progress=lambda _msg: None, **REDUCED[name])
    assert result.runs > 0 and result.acted > 0, result.notes
    assert result.ok, [f"{f.run_id} {f.condition}: {f.reason}" for f in result.failures] + result.notes
    assert result.false_positives == 0
    if name == "kill":
        takeovers = result.latencies_ms.get("whole-worker kill", [])
        assert takeovers and (percentile(takeovers, 95) or 0) <= bounds(cfg).kill_p95_ms, takeovers
    assert {w.fields.get("policy") for w in registry.all_workers()} == {"reach"}
    with transaction(readonly=True) as conn:
        reasons = [json.loads(d)["reason"] for (d,) in conn.execute(
            sa.select(run_ledger.c.detail).where(run_ledger.c.kind == "routed"))]
    assert reasons.count("submit") >= result.runs and "continuation" in reasons, Counter(reasons)


def test_fenced_workers_shows_each_worker_with_its_live_score(redis_client, settings_env):
    from typer.testing import CliRunner

    from fenced_cli import app

    settings_env(routing="reach")
    _beat("w1@h", avg_ms=400)
    _beat("w2@h", running=2)
    registry.set_status("w2@h", "draining")
    runner = CliRunner()
    data = json.loads(runner.invoke(app, ["workers", "--json"]).output)
    assert data["policy"] == "reach" and [w["name"] for w in data["workers"]] == ["w1@h", "w2@h"]
    first = data["workers"][0]["routing"]
    assert first["qualified"] and first["speed"] == pytest.approx(1 / 1.4, abs=1e-3)
    assert data["workers"][1]["routing"]["why_not"] == "draining"
    table = runner.invoke(app, ["workers"]).output
    assert "w1@h" in table and "no: draining" in table and "0.40 s" in table


def test_a_beat_prunes_queued_entries_whose_messages_are_gone(redis_client, settings_env):
    from routing.heartbeat import beat_once

    settings_env(routing="reach", routing_heartbeat_ms=500)
    client = get_redis()
    q = policy.queue_of("w1@h")
    registry.routed("w1@h", "lost", 1)  # a router died before sending: no message
    client.zadd(registry.pending("w1@h"), {"lost|1": registry.now_ms() - 5000})
    registry.routed("w1@h", "fresh", 1)  # being sent right now
    beat_once("w1@h", {"queue": q, "concurrency": 1}, 0)
    assert client.zrange(registry.pending("w1@h"), 0, -1) == ["fresh|1"]
    client.zadd(registry.pending("w1@h"), {"waiting|2": registry.now_ms() - 5000})
    client.lpush(q, "{}")  # its message still waits: nothing is pruned
    beat_once("w1@h", {"queue": q, "concurrency": 1}, 0)
    assert len(client.zrange(registry.pending("w1@h"), 0, -1)) == 2
    client.delete(q)
    client.lpush(registry.urgent_queue(q), "{}")  # a continuation waits: nothing is pruned either
    beat_once("w1@h", {"queue": q, "concurrency": 1}, 0)
    assert len(client.zrange(registry.pending("w1@h"), 0, -1)) == 2


@pytest.mark.parametrize("pool", ["threads", "gevent"])
def test_a_draining_worker_keeps_saying_so_and_gets_no_new_runs(workers, settings_env, pool):
    """SIGTERM marks a worker draining; its heartbeat keeps saying so (it would make it online again
    otherwise) for as long as its last step runs, and nothing is routed to it meanwhile. The step is long
    (4 s, 8 beats) and the test fails if the worker stopped before the window it watches ended, so an
    early offline mark cannot stand in for a draining one."""
    if pool == "gevent":  # the mark is made off gevent's hub, where the signal handler may not block
        require_extra("gevent")
    settings_env(**FAST, max_runs_per_user=100)
    workers.start("a", pool=pool)
    leaving = workers.start("b", pool=pool, FENCED_STUB_STEP_MS="4000")
    node = wait_for(lambda: next((w.name for w in registry.all_workers() if w.name.startswith("b@")), None), 10,
                    "b to register")
    first = [submit_run(f"f{i}", "buy headphones") for i in range(4)]
    wait_for(lambda: next((w for w in registry.all_workers() if w.name == node and w.running), None), 20,
             "a run in flight on b")
    leaving.kill(signal.SIGTERM)
    wait_for(lambda: get_redis().hget(registry.worker(node), "status") == "draining", 5, "b draining")
    since = registry.now_ms()
    seen, more = [], []
    while registry.now_ms() - since < 2_000:  # four of b's beats: none may make it online again
        seen.append(get_redis().hget(registry.worker(node), "status"))
        if len(more) < 4 and len(seen) % 4 == 0:
            more.append(submit_run(f"m{len(more)}", "buy headphones"))
        time.sleep(0.1)
    assert leaving.alive, "b stopped before the window ended: the test proved nothing"
    beats = int(get_redis().hget(registry.worker(node), "beat_ms") or 0)
    assert beats > since + 500, "b stopped beating while it drained"
    assert set(seen) == {"draining"}, Counter(seen)
    wait_terminal(first + more, timeout=90)
    assert all(e.detail["worker"] != node for e in _routed(first + more) if e.at_ms > since)
    status = wait_for(lambda: (lambda h: h if h.get("status") == "offline" else None)(
        get_redis().hgetall(registry.worker(node))), 15, "b offline once drained")
    assert status["offline_reason"] == "stopped", status  # said by b itself, not by the scan
    assert "registry_drain_mark_failed" not in leaving.logs(), "the mark is made when SIGTERM comes, not a beat later"


def test_a_prefork_worker_registers_routes_and_counts_its_steps(workers, settings_env):
    settings_env(**FAST)
    workers.start("p", pool="prefork", concurrency=2)
    node = wait_for(lambda: next((w.name for w in registry.all_workers() if w.name.startswith("p@")), None), 10,
                    "p to register")
    ids = [submit_run(f"u{i}", "buy headphones") for i in range(3)]
    wait_terminal(ids, timeout=60)
    assert {e.detail["worker"] for e in _routed(ids)} == {node}
    avg, rate, count = registry.step_stats(node, 50)
    assert count >= 3 and rate == 1.0 and avg is not None and avg > 0, (avg, rate, count)
    wait_for(lambda: registry.all_workers()[0].fields.get("pool") == "prefork", 5, "the beat to name the pool")
    assert not get_redis().zcard(registry.pending(node)), "every routed wake-up was consumed"
