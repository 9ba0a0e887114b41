"""The dashboard's routing panel and queue watch without a browser: the overview socket carries each worker's
score and factors (snapshot, then the workers that changed), long queues warn on the live feed and in
/metrics, and clear when they drain (issue 14). The browser side: tests/test_dashboard_browser.py."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from checkpoints import api_keys
from fenced_api.app import create_app
from fencing import registry
from routing import policy, view
from tasks import submit_run
from tests.test_dashboard import receive_until
from tests.workers_fixture import wait_terminal


@pytest.fixture
def client(mysql_store: str) -> TestClient:
    return TestClient(create_app())


def _beat(name: str, **fields: Any) -> None:
    registry.beat(name, {"queue": policy.queue_of(name), "concurrency": 4, "running": 0, "avg_step_ms": "",
                         "success_rate": "", **fields})


def _metric(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def test_the_overview_carries_each_workers_score_then_only_what_changed(client, settings_env):
    settings_env(routing="reach")
    _beat("w1@h", avg_step_ms=400)
    _beat("w2@h", running=2)
    key = api_keys.issue("ops", admin=True)
    with client.websocket_connect(f"/api/dashboard/live?key={key}") as ws:
        snap = ws.receive_json()
        routing = snap["routing"]
        assert routing["policy"] == "reach" and routing["threshold"] == 0.3
        assert routing["weights"] == {"freshness": 0.3, "speed": 0.2, "load": 0.3, "success": 0.2}
        # The same computation as `fenced workers --json` (routing.view), to the factor.
        shown = {w["name"]: w["routing"] for w in routing["workers"]}
        cli = {w["name"]: w["routing"] for w in view.snapshot()["workers"]}
        assert set(shown) == {"w1@h", "w2@h"}
        for name in shown:
            for factor in ("speed", "load", "success", "qualified", "why_not", "running", "queued", "status"):
                assert shown[name][factor] == cli[name][factor], (name, factor)
            assert shown[name]["score"] == pytest.approx(cli[name]["score"], abs=0.02)  # freshness decays meanwhile
        assert shown["w1@h"]["speed"] == pytest.approx(1 / 1.4, abs=1e-3)
        assert shown["w2@h"]["load"] == pytest.approx(1 / 3, abs=1e-3)
        assert [w["name"] for w in routing["workers"]] == ["w1@h", "w2@h"], "best first"

        # w2 drains: the next push names it, not qualified, and says why.
        registry.set_status("w2@h", "draining")
        pushed = receive_until(ws, lambda m: m["type"] == "routing"
                               and any(w["name"] == "w2@h" and w["routing"]["status"] == "draining"
                                       for w in m["workers"]))
        w2 = next(w for w in pushed["workers"] if w["name"] == "w2@h")["routing"]
        assert not w2["qualified"] and w2["why_not"] == "draining"
        assert pushed["order"] == ["w1@h", "w2@h"] and pushed["gone"] == []
        # w1 is forgotten: the push names it gone.
        registry.forget("w1@h")
        gone = receive_until(ws, lambda m: m["type"] == "routing" and m["gone"])
        assert gone["gone"] == ["w1@h"] and gone["order"] == ["w2@h"]


def test_a_long_queue_warns_on_the_live_feed_and_in_metrics_and_clears_once_drained(client, workers, settings_env):
    """No worker runs while 6 runs wait in `agents` (threshold 4): the dashboard's hub and a /metrics
    scrape see the queue over the threshold, and one `queue_long` warning reaches the live feed however
    many watch. A real worker then drains it: `queue_ok` on the feed, the gauge back to 0."""
    settings_env(routing_queue_warn=4, max_runs_per_user=100)
    ids = [submit_run(f"u{i}", "buy headphones") for i in range(6)]
    key = api_keys.issue("ops", admin=True)
    with client.websocket_connect(f"/api/dashboard/live?key={key}") as ws:
        first = ws.receive_json()
        assert first["type"] == "snapshot"
        warned = receive_until(ws, lambda m: m["type"] == "events"
                               and any(e["type"] == "queue_long" for e in m["events"]))
        [event] = [e for e in warned["events"] if e["type"] == "queue_long"]
        assert event["run_id"] == "" and event["data"]["queue"] == "agents"
        assert (event["data"]["length"], event["data"]["threshold"]) == ("6", "4")
        assert int(event["data"]["lag_ms"]) >= 0
        queues = receive_until(ws, lambda m: m["type"] == "queues" and any(q["long"] for q in m["queues"])
                               ) if not any(q["long"] for q in first["queues"]) else first
        long = next(q for q in queues["queues"] if q["queue"] == "agents")
        assert long["long"] and long["length"] == 6

        text = client.get("/metrics").text
        assert _metric(text, "fenced_queue_long", queue="agents") == 1
        assert _metric(text, "fenced_queue_long", queue="agents.continue") == 0
        assert _metric(text, "fenced_queue_depth", queue="agents") == 6
        assert (_metric(text, "fenced_queue_lag_seconds", queue="agents") or 0) > 0
        assert _metric(text, "fenced_queue_warn_threshold") == 4
        assert _metric(text, "fenced_queue_long_warnings_total", queue="agents") == 1, "said once, watched twice"

        workers.start("a")
        wait_terminal(ids, timeout=90)
        cleared = receive_until(ws, lambda m: m["type"] == "events"
                                and any(e["type"] == "queue_ok" for e in m["events"]), limit=2000)
        [ok] = [e for e in cleared["events"] if e["type"] == "queue_ok"]
        assert ok["data"]["queue"] == "agents" and int(ok["data"]["length"]) <= 3
    text = client.get("/metrics").text
    assert _metric(text, "fenced_queue_long", queue="agents") == 0
    assert _metric(text, "fenced_queue_long_warnings_total", queue="agents") == 1
    kinds = [e["kind"] for e in registry.feed()]
    assert kinds.count("queue_long") == 1 and kinds.count("queue_ok") == 1, kinds
