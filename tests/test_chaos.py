"""The chaos suite at reduced scale (short leases): every scenario must pass with real workers and stores."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chaos.harness import ChaosConfig
from chaos.report import ScenarioResult, percentile
from chaos.scenarios import bounds, run
from tests.extras import require_extra

pytestmark = pytest.mark.chaos

REDUCED = {
    "kill": {"rounds": 4, "runs": 4},  # each of the four kill moments once
    "zombie": {"times": 2},
    "wipe": {"runs": 6},
    "db-restart": {"runs": 6},
    "poison": {"runs": 3},
    "rolling": {"runs": 9},
    "child-kill": {"times": 3},
    "redis-blip": {"runs": 6},
    "hang": {"times": 1},
}


# ChaosConfig overrides per scenario. kill: a 6 s lease, twice its p95 bound (3 s), so a lease-only
# takeover (lease + reaper tick) fails the bound that fast takeover (~0.5-1.2 s) meets.
CFG: dict[str, dict[str, Any]] = {"kill": {"lease_ms": 6000}}


@pytest.mark.parametrize("name", list(REDUCED))
def test_scenario_passes_at_reduced_scale(name: str, mysql_store: str, tmp_path: Path) -> None:
    cfg = replace(ChaosConfig(lease_ms=2000, step_ms=300, tool_ms=200, log_dir=tmp_path), **CFG.get(name, {}))
    _passes(name, cfg)


@pytest.mark.parametrize("name", ["kill", "zombie"])
def test_scenario_passes_on_gevent_workers(name: str, mysql_store: str, tmp_path: Path) -> None:
    """`fenced chaos --pool gevent`: the kills and the freezes on greenlet workers (the zombie's self-stop
    fault once stopped no thread there: threading.get_ident() is a greenlet's id under gevent)."""
    require_extra("gevent")
    cfg = replace(ChaosConfig(lease_ms=2000, step_ms=300, tool_ms=200, log_dir=tmp_path, pool="gevent"),
                  **CFG.get(name, {}))
    result = _passes(name, cfg)
    assert result.params["pool"] == "gevent"
    banners = [log.read_text() for log in tmp_path.glob("w*.log")]
    assert banners and all("concurrency: 4 (gevent)" in b for b in banners), "every worker ran the gevent pool"


def _passes(name: str, cfg: ChaosConfig) -> ScenarioResult:
    result: ScenarioResult = run(name, cfg, progress=lambda _msg: None, **REDUCED[name])
    assert result.runs > 0, result.notes
    assert result.acted > 0, f"{name} hit no run in flight: it proved nothing ({result.notes})"
    assert result.ok, [f"{f.run_id} {f.condition}: {f.reason}" for f in result.failures] + result.notes
    # The scenarios fail their bounds themselves (condition `bound`); these say which bounds they were.
    bound = bounds(cfg)
    assert bound.fast_takeover
    if name == "kill":
        takeovers = result.latencies_ms.get("whole-worker kill", [])
        assert takeovers, "the kills must have interrupted runs mid-step"
        assert bound.kill_p95_ms <= cfg.lease_ms // 2, "the bound must fail a takeover that waits for the lease"
        assert (percentile(takeovers, 95) or 0) <= bound.kill_p95_ms, takeovers
    if name == "child-kill":
        takeovers = result.latencies_ms.get("pool child kill", [])
        assert len(takeovers) == REDUCED[name]["times"], "every round killed a pool child mid-step"
        assert bound.child_kill_ms <= 1000 and max(takeovers) <= bound.child_kill_ms, takeovers
    if name == "zombie":
        freezes = result.latencies_ms.get("freeze (SIGSTOP)", [])
        assert len(freezes) == REDUCED[name]["times"], "every freeze was taken over"
        assert bound.freeze_min_ms == cfg.lease_ms - cfg.lease_ms // 4 and min(freezes) >= bound.freeze_min_ms, freezes
    assert result.false_positives == 0
    return result
