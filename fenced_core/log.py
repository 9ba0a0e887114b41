"""Structured logging: key=value lines through stdlib logging; every line about a run names run_id and epoch."""

from __future__ import annotations

import logging

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: int = logging.INFO) -> None:
    """Lines below `level` cost nothing: structlog's filtering logger turns those calls into no-ops."""
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
