"""Prometheus metrics: a real worker's endpoint and the API's /metrics, scraped after real runs and a takeover."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from checkpoints import ledger, runs
from fenced_api.app import create_app
from fencing import faults, keys
from fencing.connection import get_redis
from tasks import submit_run
from tasks.explain import takeover_cause
from tests.workers_fixture import wait_for, wait_terminal

Samples = list[tuple[str, dict[str, str], float]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _parse(text: str) -> Samples:
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def _value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there is none)."""
    return sum(v for n, ls, v in samples if n == name and all(ls.get(k) == x for k, x in labels.items()))


def _scrape(port: int) -> Samples:
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert response.status_code == 200
    return _parse(response.text)


def test_metrics_move_with_real_runs_a_takeover_and_a_fence_rejection(workers) -> None:
    api = TestClient(create_app())

    def api_metrics() -> Samples:
        response = api.get("/metrics")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        return _parse(response.text)

    # Two runs wait before any worker consumes: the API sees them queued and in the broker's queue.
    ids = [submit_run("u1", "headphones"), submit_run("u2", "a laptop")]
    before = api_metrics()
    assert _value(before, "fenced_store_up", store="database") == 1
    assert _value(before, "fenced_store_up", store="redis") == 1
    assert _value(before, "fenced_runs", state="queued") == 2 and _value(before, "fenced_runs", state="done") == 0
    assert _value(before, "fenced_queue_depth", queue="agents") == 2
    assert _value(before, "fenced_queue_depth", queue="agents.continue") == 0

    slow = {"FENCED_STUB_STEP_MS": "1500"}
    pa, pb = _free_port(), _free_port()
    a = workers.start("a", FENCED_METRICS_PORT=str(pa), **slow)
    wait_terminal(ids, timeout=40)
    m = _scrape(pa)
    assert _value(m, "fenced_claims_total", agent="shopping") == 8, "four steps of two runs"
    assert _value(m, "fenced_step_seconds_count", outcome="step_done") == 6
    assert _value(m, "fenced_step_seconds_count", outcome="done") == 2
    assert _value(m, "fenced_step_seconds_sum", outcome="step_done") >= 6 * 1.5, "each step's model call took 1.5 s"
    assert _value(m, "fenced_checkpoint_write_seconds_count", checkpoint="A") == 8
    assert _value(m, "fenced_checkpoint_write_seconds_count", checkpoint="B") == 6
    assert _value(m, "fenced_checkpoint_write_seconds_count", checkpoint="terminal") == 2
    assert _value(m, "fenced_runs_finished_total", state="done") == 2
    assert _value(m, "fenced_takeovers_total") == 0
    assert _value(m, "fenced_runs", state="done") == 2, "the worker serves the cluster gauges too"
    after = api_metrics()
    assert _value(after, "fenced_runs", state="done") == 2 and _value(after, "fenced_runs", state="queued") == 0
    assert _value(after, "fenced_queue_depth", queue="agents") == 0

    # A zombie: a freezes holding a run, b takes it over when the lease expires, a wakes and is fenced out.
    zombie = submit_run("u3", "a keyboard")
    wait_for(lambda: workers.holder_of(zombie) is a, 20, "a to hold the run")
    b = workers.start("b", FENCED_METRICS_PORT=str(pb), **slow)
    a.kill(signal.SIGSTOP)
    try:
        wait_for(lambda: any(e.kind == "takeover" for e in ledger.history(zombie)), 30, "b's takeover")
    finally:
        a.kill(signal.SIGCONT)
    wait_terminal([zombie], timeout=40)
    wait_for(lambda: _value(_scrape(pb), "fenced_takeovers_total", cause="lease_expiry") == 1, 10,
             "b to count its takeover as a lease expiry (a froze with its connections open)")
    wait_for(lambda: _value(_scrape(pa), "fenced_fence_rejections_total") >= 1, 15, "a's refused write")
    [(at, _)] = [(ls["at"], v) for n, ls, v in _scrape(pa) if n == "fenced_fence_rejections_total"]
    assert at and not any(ch.isdigit() for ch in at), f"step numbers are folded out of the label: {at!r}"
    assert _value(_scrape(pb), "fenced_claims_total", agent="shopping") >= 1

    # A lease lost under its holder: the holder counts a failed renewal, reported through Redis.
    b.stop()
    lost = submit_run("u4", "a desk lamp")
    wait_for(lambda: workers.holder_of(lost) is a, 20, "a to hold the run")
    get_redis().delete(keys.lease(lost))
    wait_terminal([lost], timeout=40)
    wait_for(lambda: _value(api_metrics(), "fenced_lease_renew_failures_total") >= 1, 15,
             "the failed renewal to be reported")

    # A dead letter, and the false-positive counter fast takeover keeps in Redis.
    dead = submit_run("u5", "laptop [transient:99]")
    [run] = wait_terminal([dead], timeout=40)
    assert run.state == "dead"
    get_redis().incr(keys.FALSE_POSITIVES)
    final = api_metrics()
    assert _value(final, "fenced_dead_letters") == 1 and _value(final, "fenced_runs", state="dead") == 1
    assert _value(final, "fenced_dead_letter_stream_entries") == 1
    assert _value(final, "fenced_fast_takeover_false_positives_total") == 1
    assert _value(final, "fenced_runs", state="done") == 4
    assert _value(_scrape(pa), "fenced_dead_lettered_total") == 1
    assert runs.get_run(lost).state == "done"


def test_prefork_workers_count_their_children_in_multiprocess_mode(workers, tmp_path: Path) -> None:
    port = _free_port()
    mp = tmp_path / "prom"
    mp.mkdir()
    workers.start("p", pool="prefork", concurrency=2, FENCED_METRICS_PORT=str(port),
                  PROMETHEUS_MULTIPROC_DIR=str(mp))
    run_id = submit_run("u1", "headphones")
    wait_terminal([run_id], timeout=40)
    m = _scrape(port)
    assert _value(m, "fenced_claims_total", agent="shopping") == 4, "the children's claims, summed by the parent"
    assert _value(m, "fenced_checkpoint_write_seconds_count", checkpoint="A") == 4
    assert _value(m, "fenced_runs", state="done") == 1


def test_a_worker_without_a_metrics_port_serves_nothing(workers) -> None:
    port = _free_port()
    w = workers.start("q")
    run_id = submit_run("u1", "headphones")
    wait_terminal([run_id], timeout=40)
    assert "metrics_serving" not in w.logs()
    try:
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1)
        raise AssertionError("something answered on a port no worker was given")
    except httpx.ConnectError:
        pass


def test_api_reports_a_store_that_is_down_instead_of_zeros(mysql_store, settings_env) -> None:
    from fencing import connection

    settings_env(redis_url="redis://127.0.0.1:1/0")
    connection.reset()
    try:
        response = TestClient(create_app()).get("/metrics", headers={"accept": "text/plain"})
    finally:
        connection.reset()
    assert response.status_code == 200 and "version=0.0.4" in response.headers["content-type"]
    m = _parse(response.text)
    assert _value(m, "fenced_store_up", store="redis") == 0 and _value(m, "fenced_store_up", store="database") == 1
    assert not [n for n, _, _ in m if n == "fenced_queue_depth"], "no queue depth is better than a made-up zero"
    assert [ls["state"] for n, ls, _ in m if n == "fenced_runs"] == ["queued", "running", "waiting", "done",
                                                                    "failed", "cancelled", "dead"]


def test_a_killed_holder_is_counted_as_a_fast_takeover(workers) -> None:
    ports = {"a": _free_port(), "b": _free_port()}
    for name, port in ports.items():
        workers.start(name, FENCED_METRICS_PORT=str(port))
    faults.arm("after_tools")
    run_id = submit_run("u1", "headphones")
    hit = faults.next_hit(30)
    assert hit and hit[1] == run_id, hit
    victim = workers.by_pid(hit[2])
    victim.kill(signal.SIGKILL)  # the whole process group: its Redis connections close at once
    wait_terminal([run_id], timeout=40)
    survivor = next(w for w in workers.workers if w is not victim)
    history = ledger.history(run_id)
    [takeover] = [e for e in history if e.kind == "takeover"]
    assert takeover_cause(history, takeover.epoch) == "fast_takeover", [e.reason for e in history]
    wait_for(lambda: _value(_scrape(ports[survivor.name]), "fenced_takeovers_total", cause="fast_takeover") == 1,
             10, "the survivor to count a fast takeover")
    assert _value(_scrape(ports[survivor.name]), "fenced_takeovers_total") == 1


def test_a_killed_pool_child_is_counted_as_a_child_death_takeover(workers, tmp_path: Path) -> None:
    """OOM-style: only the prefork pool child running the step dies (SIGKILL); its parent rescues the run
    at once (fencing.liveness.child_died) and a sibling child takes it over. The parent's endpoint (the
    children's counters, multiprocess mode) counts one takeover, of cause child_death."""
    port = _free_port()
    mp = tmp_path / "prom"
    mp.mkdir()
    # A long lease: a takeover can only come from the parent seeing its child die, not from the lease.
    parent = workers.start("p", pool="prefork", concurrency=2, FENCED_METRICS_PORT=str(port),
                           PROMETHEUS_MULTIPROC_DIR=str(mp), FENCED_LEASE_TTL_MS="6000", FENCED_HEARTBEAT_MS="1500")
    faults.arm("after_tools")
    run_id = submit_run("u1", "headphones")
    hit = faults.next_hit(30)
    assert hit and hit[1] == run_id, hit
    child = hit[2]
    assert child != parent.pid and workers.by_pid(child) is parent, "the step runs in a pool child"
    assert _value(_scrape(port), "fenced_takeovers_total") == 0
    os.kill(child, signal.SIGKILL)  # the child alone, not the process group
    [run] = wait_terminal([run_id], timeout=40)
    assert run.state == "done" and parent.alive, "the parent outlived its child"
    history = ledger.history(run_id)
    [takeover] = [e for e in history if e.kind == "takeover"]
    assert takeover_cause(history, takeover.epoch) == "child_death", [e.reason for e in history]
    wait_for(lambda: _value(_scrape(port), "fenced_takeovers_total", cause="child_death") == 1, 10,
             "the worker to count a child_death takeover")
    m = _scrape(port)
    assert _value(m, "fenced_takeovers_total") == 1, [s for s in m if s[0] == "fenced_takeovers_total"]
