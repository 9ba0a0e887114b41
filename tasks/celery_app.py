"""The Celery app object and its configuration (celeryconfig): the floor of tasks/, importing none of it."""

from __future__ import annotations

from celery import Celery

from fenced_core.log import configure as configure_logging

configure_logging()  # at FENCED_LOG_LEVEL

app = Celery("fenced")
app.config_from_object("celeryconfig")

# The run task's registered name: the wake-up sender sends by name, so it needs nothing above this module.
RUN_TASK = "fenced.run_agent"
