"""Percentiles and summaries for the benchmark reports."""

from __future__ import annotations

from collections.abc import Sequence

from chaos.report import percentile


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list (chaos.report.percentile)."""
    value = percentile(values, p)
    if value is None:
        raise ValueError("no values")
    return value


def summary(values: list[float]) -> dict[str, float | int | None]:
    """n, p50, p95, p99 and max, rounded to 0.01."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    return {"n": len(values), **{f"p{p}": round(pct(values, p), 2) for p in (50, 95, 99)},
            "max": round(max(values), 2)}
