"""Scenario results: per-run failures naming the broken condition, and takeover latency percentiles."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Failure:
    run_id: str
    condition: str  # which promise broke: done / charged_once / cards / paid_once / stream / ...
    reason: str


@dataclass
class ScenarioResult:
    """One scenario's verdict: every run judged; takeover latencies (ms) by failure kind; `acted`: how many
    of its kills, freezes, wipes, restarts or blips hit a run in flight (a chaos scenario whose actions hit
    nothing fails with condition `did_nothing`; a scenario that disturbs nothing on purpose leaves it 0)."""

    name: str
    params: dict[str, Any]
    runs: int = 0
    acted: int = 0
    failures: list[Failure] = field(default_factory=list)
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    false_positives: int = 0  # holders presumed dead by fast takeover that were alive

    @property
    def failed_runs(self) -> int:
        return len({f.run_id for f in self.failures})

    @property
    def passed(self) -> int:
        return self.runs - self.failed_runs

    @property
    def ok(self) -> bool:
        return not self.failures and self.runs > 0

    def fail(self, run_id: str, condition: str, reason: str) -> None:
        self.failures.append(Failure(run_id, condition, reason))

    def latency(self, kind: str, ms: float) -> None:
        self.latencies_ms.setdefault(kind, []).append(ms)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.name, "params": self.params, "runs": self.runs, "acted": self.acted, "passed": self.passed,
            "failed": self.failed_runs, "ok": self.ok, "elapsed_s": round(self.elapsed_s, 1),
            "failures": [f.__dict__ for f in self.failures], "notes": self.notes,
            "fast_takeover_false_positives": self.false_positives,
            "takeover_ms": {kind: {"n": len(v), "p50": percentile(v, 50), "p95": percentile(v, 95),
                                   "max": max(v) if v else None} for kind, v in self.latencies_ms.items()},
        }


def render(results: list[ScenarioResult], out: Console | None = None) -> None:
    """The verdict table, then every failure with its run and broken condition."""
    out = out or Console()
    table = Table(title="fenced chaos verdict")
    for col in ("scenario", "runs", "acted", "passed", "failed", "takeover p50 / p95 / max (ms)", "false +", "time"):
        table.add_column(col)
    for r in results:
        lat = "; ".join(f"{kind}: {_ms(percentile(v, 50))} / {_ms(percentile(v, 95))} / {_ms(max(v))} (n={len(v)})"
                        for kind, v in r.latencies_ms.items() if v) or "-"
        table.add_row(r.name, str(r.runs), f"[{'green' if r.acted else 'red'}]{r.acted}[/]", f"[green]{r.passed}[/]",
                      f"[{'red' if r.failed_runs else 'green'}]{r.failed_runs}[/]", lat, str(r.false_positives),
                      f"{r.elapsed_s:.0f} s")
    out.print(table)
    for r in results:
        for note in r.notes:
            out.print(f"[dim]{r.name}: {note}[/]")
        for f in r.failures:
            out.print(f"[red]{r.name}: run {f.run_id} broke '{f.condition}': {f.reason}[/]")
    verdict = all(r.ok for r in results)
    out.print(f"[bold {'green' if verdict else 'red'}]verdict: {'PASS' if verdict else 'FAIL'}[/]")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"
