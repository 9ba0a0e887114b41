"""Redis Sentinel: fenced's Redis and the broker through a real local Sentinel deployment
(scripts/redis-sentinel.sh: a primary, a replica, three sentinels), and the chaos scenarios through it.

The deployment's ports (6411, 6412, 26411-26413 unless FENCED_SENTINEL_* say otherwise) are its own;
its primary is SIGKILLed here, so nothing else may use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from pydantic import ValidationError

from fenced_core.errors import ConfigError
from fenced_core.settings import Settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "redis-sentinel.sh")


# -- URLs and settings (no servers) ----------------------------------------------------------------------
def test_store_urls_name_sentinels_master_and_db():
    from fencing.sentinel import parse_url

    target = parse_url("redis+sentinel://127.0.0.1:26411,[::1]:26412/fenced/3")
    assert target.sentinels == (("127.0.0.1", 26411), ("::1", 26412))
    assert (target.master_name, target.db) == ("fenced", 3)
    assert parse_url("redis+sentinel://h:1/m").db == 0
    for bad, says in [("redis+sentinel://127.0.0.1:26411", "names its master"),
                      ("redis+sentinel://127.0.0.1/fenced/0", "HOST:PORT"),
                      ("redis+sentinel://127.0.0.1:26411/fenced/x", "is a number"),
                      ("redis://127.0.0.1:6379/0", "not a Sentinel URL")]:
        with pytest.raises(ConfigError, match=says):
            parse_url(bad)


def test_broker_urls_are_kombus_list_with_the_master_named_apart():
    from fencing.sentinel import parse_broker_url

    target = parse_broker_url("sentinel://127.0.0.1:26411/2;sentinel://127.0.0.1:26412", "fenced")
    assert target.sentinels == (("127.0.0.1", 26411), ("127.0.0.1", 26412))
    assert (target.master_name, target.db) == ("fenced", 2)
    with pytest.raises(ConfigError, match="FENCED_BROKER_MASTER_NAME"):
        parse_broker_url("sentinel://127.0.0.1:26411", "")
    with pytest.raises(ConfigError, match="not a Sentinel broker URL"):
        parse_broker_url("sentinel://127.0.0.1:26411;redis://127.0.0.1:6379", "fenced")


def test_a_sentinel_broker_needs_its_master_name():
    with pytest.raises(ValidationError, match="FENCED_BROKER_MASTER_NAME"):
        Settings(broker_url="sentinel://127.0.0.1:26411;sentinel://127.0.0.1:26412")
    s = Settings(broker_url="sentinel://127.0.0.1:26411", broker_master_name="fenced")
    assert s.broker_master_name == "fenced"


def test_celeryconfig_gives_kombu_the_master_name_for_a_sentinel_broker():
    code = "import celeryconfig, json; print(json.dumps(celeryconfig.broker_transport_options))"

    def options(**env: str) -> dict[str, object]:
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env}, check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    sentinel = options(FENCED_BROKER_URL="sentinel://127.0.0.1:26411;sentinel://127.0.0.1:26412",
                       FENCED_BROKER_MASTER_NAME="fenced")
    assert sentinel["master_name"] == "fenced"
    assert sentinel["queue_order_strategy"] == "priority"  # the plain settings are kept
    assert "master_name" not in options(FENCED_BROKER_URL="redis://127.0.0.1:6379/0")


# -- a real deployment ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sentinel_urls() -> Iterator[dict[str, str]]:
    """The local deployment, started (or found running) and settled; its FENCED_* URLs. Stopped at the
    end when this module started it."""
    status = subprocess.run(["bash", SCRIPT, "status"], check=True, capture_output=True, text=True).stdout
    subprocess.run(["bash", SCRIPT, "start"], check=True, capture_output=True, timeout=120)
    out = subprocess.run(["bash", SCRIPT, "urls"], check=True, capture_output=True, text=True).stdout
    yield {name: value.strip("'") for name, _, value in (line.partition("=") for line in out.splitlines())}
    if " down" in status:
        subprocess.run(["bash", SCRIPT, "stop"], check=True, capture_output=True, timeout=60)


@pytest.fixture
def through_sentinel(sentinel_urls: dict[str, str], settings_env: Callable[..., None]) -> Iterator[dict[str, str]]:
    """This process's fenced Redis and broker clients on the Sentinel deployment, for one test."""
    from fencing import broker, connection

    settings_env(redis_url=sentinel_urls["FENCED_REDIS_URL"], broker_url=sentinel_urls["FENCED_BROKER_URL"],
                 broker_master_name=sentinel_urls["FENCED_BROKER_MASTER_NAME"])
    connection.reset()
    broker._clients.clear()
    yield sentinel_urls
    connection.reset()
    broker._clients.clear()
    subprocess.run(["bash", SCRIPT, "start"], check=True, capture_output=True, timeout=120)  # a killed server back


def test_the_deployment_script_is_idempotent_and_agrees_on_one_master(sentinel_urls):
    again = subprocess.run(["bash", SCRIPT, "start"], check=True, capture_output=True, text=True).stdout
    assert "starting" not in again and "sentinel ready: master fenced at 127.0.0.1:" in again
    status = subprocess.run(["bash", SCRIPT, "status"], check=True, capture_output=True, text=True).stdout
    masters = {line.rsplit(" ", 1)[1] for line in status.splitlines() if line.startswith("sentinel ")}
    assert len(masters) == 1, status
    assert sorted(line.split()[2] for line in status.splitlines() if line.startswith("redis ")) == ["master", "slave"]


def test_fenced_redis_rides_out_a_failover_and_liveness_sees_who_reconnected(through_sentinel):
    """Scripts, pipelines, events and the broker client work through Sentinel; while no master is known
    every call raises RedisUnavailable (nothing else); afterwards this process's named connections are on
    the promoted replica, so fast takeover's CLIENT LIST check keeps it alive and presumes a holder with
    no connection dead."""
    import redis

    from chaos.sentinel import SentinelNode
    from fencing import epoch, events, keys, lease, liveness
    from fencing.broker import get_broker_redis
    from fencing.connection import RedisUnavailable, get_redis, process_token

    client = get_redis()
    run_id = f"sentinel-{time.time_ns()}"
    assert epoch.raise_epoch(run_id, 3) == 3
    events.append(run_id, 3, "e1", "step_started", 0)
    assert [e.eid for e in events.read(run_id)] == ["e1"]
    assert get_broker_redis().llen("agents") >= 0
    node = SentinelNode()
    failover = node.kill_master()
    errors: list[Exception] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            epoch.raise_epoch(run_id, 4)
            break
        except redis.RedisError as exc:  # RedisUnavailable is one; anything else fails below
            errors.append(exc)
            time.sleep(0.05)
    node.wait_promoted(failover, timeout_s=10)
    assert failover.happened, f"no new master after killing {failover.old}"
    assert errors and all(isinstance(e, RedisUnavailable) for e in errors), {type(e).__name__ for e in errors}
    assert epoch.current(run_id) == 4
    assert client.connection_pool.get_master_address() == failover.new  # type: ignore[attr-defined]

    # Liveness on the new master: this process (connected, named) stays; a holder with no connection goes.
    ghost = "ghost-host:1:deadbeef"
    pipe = client.pipeline(transaction=False)
    lease.register(pipe)
    lease.register(pipe, process=ghost)
    pipe.execute()
    client.delete(keys.LIVENESS_SUSPECTS)
    for _ in range(liveness.MISSES_TO_PRESUME_DEAD):
        client.delete(keys.LIVENESS_LOCK)
        liveness.check_connections(lambda _run_id: None)
    presumed = client.zrange(keys.PRESUMED_DEAD, 0, -1)
    assert ghost in presumed
    assert process_token() not in presumed, "a live, reconnected process was presumed dead after the failover"
    assert get_broker_redis().llen("agents") >= 0  # the broker's client found the new master too


# -- chaos through Sentinel (real workers, real failovers) --------------------------------------------------
def _chaos(*args: str, timeout_s: float) -> list[dict[str, object]]:
    done = subprocess.run([sys.executable, "-m", "fenced_cli", "chaos", "--sentinel", "--json", *args], cwd=ROOT,
                          env=os.environ.copy(), capture_output=True, text=True, timeout=timeout_s)
    start = done.stdout.find("[\n")
    assert start >= 0, f"exit {done.returncode}, no JSON:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout[start:])


@pytest.mark.chaos
def test_redis_failover_and_kill_pass_through_sentinel(mysql_store, sentinel_urls):
    """`fenced chaos --sentinel`: two failovers of the primary with runs in flight, and the kill scenario."""
    results = {r["scenario"]: r for r in _chaos("-s", "redis-failover", "-s", "kill", "--rounds", "2", "--runs", "6",
                                                "--lease-ms", "2000", "--step-ms", "300", timeout_s=600)}
    for name in ("redis-failover", "kill"):
        r = results[name]
        assert r["runs"] and r["acted"], r
        assert r["ok"], (r["failures"], r["notes"])
    failover = results["redis-failover"]
    assert failover["acted"] == 2, failover["notes"]  # both rounds: primary dead, runs in flight, a new master
    assert failover["takeover_ms"]["failover (kill -> new master)"]["n"] == 2
    assert failover["takeover_ms"]["recovery (kill -> every run ended)"]["n"] == 2
    assert results["kill"]["takeover_ms"]["whole-worker kill"]["n"] >= 1
    # Every worker's consumer reconnected by itself: none exited on kombu's close path (tasks/kombu_close_fix.py),
    # so the scenario's stand-in supervisor never had to restart one.
    broker_notes = [n for n in failover["notes"] if n.startswith("broker failover per worker")]
    assert len(broker_notes) == 2 and all("lost the broker 1x" in n for n in broker_notes), broker_notes
    assert all(n.endswith("restarted by the supervisor so far: none") for n in broker_notes), broker_notes
