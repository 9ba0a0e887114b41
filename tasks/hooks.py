"""Hooks: small classes with no-op methods (Dramatiq's middleware) that metrics, live push and routing
subclass, so they plug in without editing the step runner.

Each hook is called after the commit it reports, never inside a fenced transaction (checked), in the
process that made the commit. A hook that raises is logged with run_id and epoch and never breaks the
run. Hooks are notices, not guarantees: a process killed right after a commit calls none, and a takeover
may report a step again (on_claim / on_takeover of the new holder)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog

from checkpoints.db import in_transaction
from fenced_core.errors import Interrupt

log = structlog.get_logger("tasks.hooks")


class Hooks:
    """Subclass and override what you need; register with `add_hooks`. Every method is a no-op here.

    Each method is called after the commit it reports, outside any fenced transaction, in the process
    that made the commit; one that raises is logged and never breaks the run. Hooks are notices, not
    guarantees: a process that crashes right after a commit calls none, and after a takeover the new
    holder reports its own claim (and `on_takeover`), so a step may be reported twice. Count from the
    ledger (`fenced explain`) when exactness matters."""

    def on_claim(self, run_id: str, epoch: int, step: int, agent: str) -> None:
        """A delivery claimed the run at `step` as holder `epoch` (every claim, takeovers included)."""

    def on_takeover(self, run_id: str, epoch: int, step: int, previous_owner: str | None, phase: str) -> None:
        """The claim took the run over from `previous_owner`, resuming at `step` from checkpoint `phase`."""

    def on_step_done(self, run_id: str, epoch: int, step: int, name: str) -> None:
        """Checkpoint B of `step` committed; the next step is handed over."""

    def on_fenced_out(self, run_id: str, epoch: int, what: str) -> None:
        """Holder `epoch` was refused at `what` (a newer claim or a cancel owns the run); it stopped."""

    def on_dead_letter(self, run_id: str, epoch: int, step: int, reason: str) -> None:
        """The run was dead-lettered at `step` (repeated crashes, exhausted retries); a replay may revive it."""

    def on_finished(self, run_id: str, epoch: int, state: str, data: dict[str, Any]) -> None:
        """The run ended `state` (done, failed or cancelled), settled; `data` is its final event's data."""


_hooks: list[Hooks] = []
_lock = threading.Lock()


def add_hooks(hooks: Hooks) -> Hooks:
    """Register `hooks` in this process (called in registration order); returns it. Register at import
    of a module the workers load (FENCED_IMPORTS), so every pool process has it, and a worker restarted
    after a crash, or one whose claim is a takeover, has it too."""
    if not isinstance(hooks, Hooks):
        raise TypeError(f"add_hooks takes a Hooks instance, not {type(hooks).__name__}")
    with _lock:
        _hooks.append(hooks)
    return hooks


def remove_hooks(hooks: Hooks) -> None:
    """Unregister `hooks` in this process (no-op if it is not registered). Other processes keep theirs: a
    run taken over by another worker (after a crash here, say) still reports to the hooks registered there."""
    with _lock:
        if hooks in _hooks:
            _hooks.remove(hooks)


def _fire(method: str, run_id: str, epoch: int, call: Callable[[Hooks], None]) -> None:
    if in_transaction():  # a hook that waits would hold the run's row lock: a bug in the caller
        raise RuntimeError(f"hook {method} called inside a database transaction (run {run_id})")
    with _lock:
        registered = list(_hooks)
    for hooks in registered:
        try:
            call(hooks)
        except (Exception, Interrupt) as exc:  # a hook never breaks a run, whatever it raises
            log.error("hook_failed", hook=type(hooks).__name__, method=method, run_id=run_id, epoch=epoch,
                      error=repr(exc))


def claimed(run_id: str, epoch: int, step: int, agent: str) -> None:
    """Fire on_claim."""
    _fire("on_claim", run_id, epoch, lambda h: h.on_claim(run_id, epoch, step, agent))


def took_over(run_id: str, epoch: int, step: int, previous_owner: str | None, phase: str) -> None:
    """Fire on_takeover."""
    _fire("on_takeover", run_id, epoch, lambda h: h.on_takeover(run_id, epoch, step, previous_owner, phase))


def step_done(run_id: str, epoch: int, step: int, name: str) -> None:
    """Fire on_step_done."""
    _fire("on_step_done", run_id, epoch, lambda h: h.on_step_done(run_id, epoch, step, name))


def fenced_out(run_id: str, epoch: int, what: str) -> None:
    """Fire on_fenced_out."""
    _fire("on_fenced_out", run_id, epoch, lambda h: h.on_fenced_out(run_id, epoch, what))


def dead_lettered(run_id: str, epoch: int, step: int, reason: str) -> None:
    """Fire on_dead_letter."""
    _fire("on_dead_letter", run_id, epoch, lambda h: h.on_dead_letter(run_id, epoch, step, reason))


def finished(run_id: str, epoch: int, state: str, data: dict[str, Any]) -> None:
    """Fire on_finished."""
    _fire("on_finished", run_id, epoch, lambda h: h.on_finished(run_id, epoch, state, data))
