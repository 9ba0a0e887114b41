"""A run's result, read from its row: what `AsyncResult` cannot tell (fenced stores no Celery results).

`run_agent.delay(run_id)` returns an AsyncResult whose `.get()` is None and whose `.state` needs a
result backend fenced does not use: a message is only a wake-up call, and the run row is the truth.
Use `result(run_id)` for the run as it is and `wait(run_id)` to block until it ends or waits on a person.
(Front ends, scoped to a caller, read through tasks.service instead.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from checkpoints import runs
from checkpoints.schema import TERMINAL_STATES
from fenced_core.errors import RunNotFound

ENDED = TERMINAL_STATES  # done, failed, cancelled, dead: a replay is the only way out of one (runs.TRANSITIONS)


@dataclass(frozen=True)
class RunResult:
    """A run as its row says now. `answer` is set when `state` is done; `error` says why otherwise.

    A snapshot of committed state: a crash or a takeover after it was read may move the run on, never back."""

    run_id: str
    state: str
    step: int
    answer: str | None
    error_class: str | None
    error: str | None
    model_calls: int

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def result(run_id: str) -> RunResult:
    """The run's state and outcome now; raises RunNotFound for an unknown id.

    Reads the committed row only: after a worker's crash it shows the last checkpoint (the step a
    takeover resumes), never a half-written step; during a takeover, a fenced-out holder's writes never
    show; `answer` is set once, by the holder whose terminal write passed the fence."""
    run = runs.peek_run(run_id)
    if run is None:
        raise RunNotFound(f"no run {run_id!r}")
    return RunResult(run.run_id, run.state, run.step, run.answer, run.error_class, run.error, run.model_calls)


def wait(run_id: str, timeout_s: float | None = None, *, until_waiting: bool = True, poll_s: float = 0.2) -> RunResult:
    """Block until the run ended (done, failed, cancelled, dead), or waits on a person (`until_waiting`);
    raises TimeoutError after `timeout_s`. Survives worker crashes and takeovers like the run does: it
    only reads the row, which only the current holder can write, so it never sees a superseded answer."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        now = result(run_id)
        if now.ended or (until_waiting and now.state == "waiting"):
            return now
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"run {run_id} still {now.state} at step {now.step} after {timeout_s:g} s")
        time.sleep(poll_s)
