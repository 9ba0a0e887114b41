"""The chaos suite at reduced scale (short leases): every scenario must pass with real workers and stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.harness import ChaosConfig
from chaos.report import ScenarioResult
from chaos.scenarios import run

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


@pytest.mark.parametrize("name", list(REDUCED))
def test_scenario_passes_at_reduced_scale(name: str, mysql_store: str, tmp_path: Path) -> None:
    cfg = ChaosConfig(lease_ms=2000, step_ms=300, tool_ms=200, log_dir=tmp_path)
    result: ScenarioResult = run(name, cfg, progress=lambda _msg: None, **REDUCED[name])
    assert result.runs > 0, result.notes
    assert result.ok, [f"{f.run_id} {f.condition}: {f.reason}" for f in result.failures] + result.notes
    if name == "kill":
        takeovers = result.latencies_ms.get("whole-worker kill", [])
        assert takeovers, "the kills must have interrupted runs mid-step"
        assert max(takeovers) <= cfg.lease_ms + 2000 + 1000, takeovers
    assert result.false_positives == 0
