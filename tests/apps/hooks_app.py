"""A user's hooks module, imported by workers through FENCED_IMPORTS: one hook records every call in a
Redis list, another raises on every call (a hook that raises must never break a run)."""

from __future__ import annotations

import json
import os
from typing import Any

import examples.shopping  # noqa: F401  (the runs these tests submit are the shopping agent's)
from fencing.connection import get_redis
from tasks.hooks import Hooks, add_hooks

CALLS_KEY = "test:hooks:calls"  # a test's own key, outside fenced's prefix


class Recorder(Hooks):
    """Appends {"hook", "run_id", "epoch", "pid", ...} to CALLS_KEY for every call."""

    def _record(self, hook: str, run_id: str, epoch: int, **more: Any) -> None:
        entry = {"hook": hook, "run_id": run_id, "epoch": epoch, "pid": os.getpid(), **more}
        get_redis().rpush(CALLS_KEY, json.dumps(entry, default=str))

    def on_claim(self, run_id: str, epoch: int, step: int, agent: str) -> None:
        self._record("on_claim", run_id, epoch, step=step, agent=agent)

    def on_takeover(self, run_id: str, epoch: int, step: int, previous_owner: str | None, phase: str) -> None:
        self._record("on_takeover", run_id, epoch, step=step, previous_owner=previous_owner, phase=phase)

    def on_step_done(self, run_id: str, epoch: int, step: int, name: str) -> None:
        self._record("on_step_done", run_id, epoch, step=step, name=name)

    def on_fenced_out(self, run_id: str, epoch: int, what: str) -> None:
        self._record("on_fenced_out", run_id, epoch, what=what)

    def on_dead_letter(self, run_id: str, epoch: int, step: int, reason: str) -> None:
        self._record("on_dead_letter", run_id, epoch, step=step, reason=reason)

    def on_finished(self, run_id: str, epoch: int, state: str, data: dict[str, Any]) -> None:
        self._record("on_finished", run_id, epoch, state=state)


class Raiser(Hooks):
    """Raises from every hook it has."""

    def on_claim(self, run_id: str, epoch: int, step: int, agent: str) -> None:
        raise RuntimeError("hook on_claim broke")

    def on_step_done(self, run_id: str, epoch: int, step: int, name: str) -> None:
        raise RuntimeError("hook on_step_done broke")

    def on_finished(self, run_id: str, epoch: int, state: str, data: dict[str, Any]) -> None:
        raise ValueError("hook on_finished broke")


if os.environ.get("TEST_HOOKS_RAISE") == "1":
    add_hooks(Raiser())  # first, so the recorder after it shows the raise skipped nothing
add_hooks(Recorder())
