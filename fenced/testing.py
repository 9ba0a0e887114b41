"""Hooks for test and chaos harnesses that an app's own model or tools may call: fault points and paid calls.

Both are inert in a deployment: fault points fire only with FENCED_FAULTS_ENABLED (and armed by a test),
and paid calls are counted only when the caller chooses to (the stub model with FENCED_STUB_COUNT_PAID).
"""

from __future__ import annotations

from fenced_core.settings import get_settings
from fencing import faults as _faults
from fencing import metering as _metering


def faults_enabled() -> bool:
    """Whether fault points and test markers are live in this process (FENCED_FAULTS_ENABLED: tests, chaos)."""
    return get_settings().faults_enabled


def fault_point(name: str, run_id: str) -> None:
    """Pass the named fault point (fencing.faults.POINTS, such as "before_effect" or "in_confirm").

    Does nothing unless faults are enabled and a test armed it; then it hangs this thread, kills or
    freezes this process group, as the test asked: a crash or a freeze exactly here, which the run's
    fencing must survive (a frozen holder that wakes after a takeover is fenced out of its next write)."""
    _faults.point(name, run_id)


def count_paid_call(run_id: str, epoch: int, step: int) -> None:
    """Count one model call a provider would bill, for `step` of `run_id` under holder `epoch`.

    Kept in Redis where the runtime never writes, so the history checker can hold the calls the run
    recorded against the calls paid: a call lost or made twice by a crash or a takeover shows there."""
    _metering.count_paid_call(run_id, epoch, step)


__all__ = ["count_paid_call", "fault_point", "faults_enabled"]
