"""fenced: durable, fenced, resumable agent runs on Celery. The public API; this module defines nothing.

- `Agent`, `tool`, `effect`, `ToolContext`: agents from a model and plain typed functions (fenced_agents);
  model adapters in `fenced.models`, a pydantic-ai agent wrapped in `fenced.pydantic_ai` (optional extra).
- `FencedTask`, `step`: durable multi-step Celery tasks (tasks.fenced_task).
- `Hooks`, `add_hooks`, `remove_hooks`: react to claims, takeovers, steps, fence rejections, dead letters
  and endings, outside every transaction (tasks.hooks).
- `once`, `ask_user`, `current_run`: effects once per run, questions to a person, the run being executed
  (tasks.context).
- `install(app)`: put fenced into your own Celery app (tasks.install).
- `register_cards(provider)`: an app's confirmable cards, shown and confirmed by the CLI and the HTTP API
  through tasks.service; `fenced.store` (an app's own tables: transactions, perform_once, the ledger),
  `fenced.testing` (fault points, paid-call metering) and `fenced.config` (settings errors) for apps.
- `submit_run`, `submit_many` (`SubmitRequest` -> `SubmitOutcome`), `run_agent`, `result`, `wait`: the runtime's
  entry points (tasks).
"""

from __future__ import annotations

from fenced_agents import Agent, InvalidArguments, ToolContext, effect, tool
from fenced_core.errors import (
    AdmissionRefused,
    BudgetExceeded,
    FencedOut,
    FixableError,
    IdempotencyConflict,
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
from tasks.hooks import Hooks, add_hooks, remove_hooks
from tasks.install import install
from tasks.service import CardNotFound, register_cards
from tasks.submit import SubmitOutcome, SubmitRequest, submit_many

__all__ = [
    "AdmissionRefused",
    "Agent",
    "BudgetExceeded",
    "CardNotFound",
    "FencedOut",
    "FencedTask",
    "FixableError",
    "Hooks",
    "IdempotencyConflict",
    "InsufficientCredits",
    "InvalidArguments",
    "InvalidRequest",
    "MaxStepsExceeded",
    "RunContext",
    "RunHandle",
    "RunNotFound",
    "StoreUnavailable",
    "SubmitOutcome",
    "SubmitRequest",
    "TerminalError",
    "ToolContext",
    "TransientError",
    "add_hooks",
    "ask_user",
    "current_run",
    "effect",
    "install",
    "once",
    "register_cards",
    "remove_hooks",
    "result",
    "run_agent",
    "step",
    "submit_many",
    "submit_run",
    "tool",
    "wait",
]
