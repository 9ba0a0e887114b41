"""Structured logging: key=value lines through stdlib logging; every line about a run names run_id and epoch."""

from __future__ import annotations

import logging

import structlog


def _settings_level() -> int:
    """FENCED_LOG_LEVEL as a logging level; info while the settings cannot be read (celeryconfig or the
    CLI then says which variable is wrong, and stops)."""
    from fenced_core.errors import ConfigError
    from fenced_core.settings import get_settings

    try:
        return int(logging.getLevelName(get_settings().log_level.upper()))
    except ConfigError:
        return logging.INFO


def configure(level: int | None = None) -> None:
    """Lines below `level` (default: FENCED_LOG_LEVEL) cost nothing: structlog's filtering logger turns
    those calls into no-ops."""
    level = _settings_level() if level is None else level
    if not logging.getLogger().handlers:
        logging.basicConfig(level=level, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event", "run_id", "epoch"],
                                                  drop_missing=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
