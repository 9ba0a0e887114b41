"""Celery side of fenced: `celery -A tasks worker`, `run_agent.delay(run_id)`, `submit_run(...)`."""

from __future__ import annotations

from tasks.app import app, run_agent
from tasks.result import RunResult, result, wait
from tasks.submit import submit_run

celery = app
__all__ = ["RunResult", "app", "celery", "result", "run_agent", "submit_run", "wait"]
