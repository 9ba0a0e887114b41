"""Takeover latency, SIGKILL of a whole worker -> `task_resumed` of each run it held, from the chaos kill
scenario (`chaos.scenarios.kill`), at a given lease: with fast takeover off (the lease must run out:
what a frozen or cut-off worker costs) and on (a dead process is noticed by its vanished connections)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def measure(lease_ms: int, fast: bool, rounds: int, log_dir: Path) -> dict[str, Any]:
    """One kill scenario; returns the runs judged, how many passed and the takeover p50/p95/max (ms)."""
    from chaos.harness import ChaosConfig
    from chaos.scenarios import bounds, run

    saved = os.environ.get("FENCED_FAST_TAKEOVER")
    os.environ["FENCED_FAST_TAKEOVER"] = "1" if fast else "0"  # the chaos workers inherit os.environ
    try:
        cfg = ChaosConfig(lease_ms=lease_ms, log_dir=log_dir / f"takeover-{lease_ms}-{int(fast)}")
        target_ms = bounds(cfg).kill_p95_ms  # the chaos suite's own bound for this lease and mode
        result = run("kill", cfg, progress=lambda _msg: None, rounds=rounds, runs=6)
    finally:
        if saved is None:
            os.environ.pop("FENCED_FAST_TAKEOVER", None)
        else:
            os.environ["FENCED_FAST_TAKEOVER"] = saved
    d = result.to_dict()
    latency = d["takeover_ms"].get("whole-worker kill", {"n": 0, "p50": None, "p95": None, "max": None})
    return {"lease_ms": lease_ms, "fast_takeover": fast, "rounds": rounds, "runs": d["runs"],
            "passed": d["passed"], "ok": d["ok"], "failures": d["failures"][:5], "notes": d["notes"],
            "false_positives": d["fast_takeover_false_positives"],
            **{k: latency[k] for k in ("n", "p50", "p95", "max")},
            "target_p95_ms": target_ms}
