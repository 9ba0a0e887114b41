"""fenced: durable, fenced, resumable agent runs on Celery. The public API; this module defines nothing.

- `FencedTask`, `step`: durable multi-step Celery tasks (tasks.fenced_task).
- `once`, `ask_user`, `current_run`: effects once per run, questions to a person, the run being executed
  (tasks.context).
- `install(app)`: put fenced into your own Celery app (tasks.install).
- `submit_run`, `run_agent`, `result`, `wait`: the runtime's entry points (tasks).
"""

from __future__ import annotations

from fenced_core.errors import (
    AdmissionRefused,
    BudgetExceeded,
    FencedOut,
    FixableError,
    InsufficientCredits,
    InvalidRequest,
    MaxStepsExceeded,
    RunNotFound,
    StoreUnavailable,
    TerminalError,
    TransientError,
)
from tasks import result, run_agent, submit_run, wait
from tasks.context import RunContext, ask_user, once
from tasks.context import current as current_run
from tasks.fenced_task import FencedTask, RunHandle, step
from tasks.install import install

__all__ = [
    "AdmissionRefused",
    "BudgetExceeded",
    "FencedOut",
    "FencedTask",
    "FixableError",
    "InsufficientCredits",
    "InvalidRequest",
    "MaxStepsExceeded",
    "RunContext",
    "RunHandle",
    "RunNotFound",
    "StoreUnavailable",
    "TerminalError",
    "TransientError",
    "ask_user",
    "current_run",
    "install",
    "once",
    "result",
    "run_agent",
    "step",
    "submit_run",
    "wait",
]
