"""Settings for an app: the error a bad setting raises, and pydantic's validation errors as one clear line."""

from __future__ import annotations

from pydantic import ValidationError

from fenced_core.errors import ConfigError
from fenced_core.settings import describe


def settings_error(exc: ValidationError) -> ConfigError:
    """A ConfigError for an app's settings validation error: one `FENCED_X='value': what is accepted` per
    bad variable, as fenced's own settings report theirs (the CLI prints it and exits)."""
    return ConfigError(describe(exc))


__all__ = ["ConfigError", "settings_error"]
