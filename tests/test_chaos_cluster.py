"""The chaos suite on a real local Redis Cluster (tests/cluster_fixture.py), at reduced scale: fenced's Redis
on the cluster, the broker on the plain test Redis. kill and zombie as on one Redis, then
cluster-master-kill: a master SIGKILLed mid-flight, its replica promoted, every run finished once."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chaos.harness import ChaosConfig
from chaos.report import ScenarioResult
from chaos.scenarios import run
from tests.cluster_fixture import on_cluster, redis_cluster  # noqa: F401  (fixtures)

pytestmark = pytest.mark.chaos

REDUCED: dict[str, dict[str, int]] = {
    "kill": {"rounds": 2, "runs": 4},
    "zombie": {"times": 2},
    "cluster-master-kill": {"times": 2, "runs": 6},
}
CFG: dict[str, dict[str, Any]] = {"kill": {"lease_ms": 6000}}


@pytest.mark.parametrize("name", list(REDUCED))
def test_scenario_passes_on_the_cluster(name: str, on_cluster: Any, mysql_store: str,  # noqa: F811
                                        tmp_path: Path) -> None:
    from fencing.cluster import is_cluster
    from fencing.connection import get_redis

    assert is_cluster(get_redis()), "the scenario must run with fenced's Redis on the cluster"
    cfg = replace(ChaosConfig(lease_ms=2000, step_ms=300, tool_ms=200, log_dir=tmp_path), **CFG.get(name, {}))
    result: ScenarioResult = run(name, cfg, progress=lambda _msg: None, **REDUCED[name])
    assert result.runs > 0, result.notes
    assert result.acted > 0, f"{name} hit no run in flight: it proved nothing ({result.notes})"
    assert result.ok, [f"{f.run_id} {f.condition}: {f.reason}" for f in result.failures] + result.notes
    if name == "cluster-master-kill":
        assert result.latencies_ms.get("master kill -> replica promoted"), result.notes
        assert any("taken over after the kill" in n for n in result.notes), result.notes
        assert any(n.startswith("stale writes refused by the epoch") and not n.endswith(": 0")
                   for n in result.notes), result.notes
