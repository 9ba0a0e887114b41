"""Whose turn it is: the periodic jobs every worker ticks (the liveness check, the sweep, the large-run
promotion, the routing scan) run in one process per period, so their cost does not grow with the pool."""

from __future__ import annotations

from typing import Any

TURN_SHARE = 0.8  # a turn lasts this share of the period


def take_turn(client: Any, key: str, token: str, period_ms: int) -> bool:
    """True for the one process that runs the job this period (SET NX PX on `key`).

    A turn ends before the period does. With a turn as long as the period, whether the same process's
    next tick (due one period after the last one started) found its own turn over was left to timing: a
    timer on time to the millisecond found it still held about half the time (18 of 40 ticks, measured),
    so a lone worker would run each job every second period. A worker's timer fires a little late, so
    it mostly did not (the chaos kill's takeover was the same before and after this change). Two
    processes' turns may now start 0.8 period apart instead of one. Every job is safe to run twice (each
    is idempotent or fenced); the liveness check counts a miss per check, so a holder's two misses may
    now be 0.8 tick apart (a mistaken presumption costs work, never correctness: epochs fence it)."""
    return bool(client.set(key, token, nx=True, px=max(1, int(period_ms * TURN_SHARE))))
