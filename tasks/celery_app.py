"""The Celery app object and its configuration (celeryconfig): the floor of tasks/, importing none of it."""

from __future__ import annotations

from celery import Celery

from fenced_core.errors import ConfigError
from fenced_core.log import LEVELS
from fenced_core.log import configure as configure_logging
from fenced_core.settings import get_settings


def _log_level() -> int:
    try:
        return LEVELS[get_settings().log_level]
    except ConfigError:  # a bad FENCED_* variable: celeryconfig or the CLI says which, and stops
        return LEVELS["info"]


configure_logging(_log_level())

app = Celery("fenced")
app.config_from_object("celeryconfig")

# The run task's registered name: the wake-up sender sends by name, so it needs nothing above this module.
RUN_TASK = "fenced.run_agent"
