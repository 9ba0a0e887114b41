"""Percentiles and summaries for the benchmark reports."""

from __future__ import annotations

import math


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary(values: list[float]) -> dict[str, float | int | None]:
    """n, p50, p95, p99 and max, rounded to 0.01."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    return {"n": len(values), **{f"p{p}": round(pct(values, p), 2) for p in (50, 95, 99)},
            "max": round(max(values), 2)}
