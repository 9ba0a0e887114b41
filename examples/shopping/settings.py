"""The shopping demo's own settings (stub model, model choice, cart cards), read from FENCED_* variables."""

from __future__ import annotations

import functools
from typing import Literal

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from fenced.config import settings_error


class ShoppingSettings(BaseSettings):
    """What only the demo reads. The variable names are the ones the core used to read (FENCED_STUB_STEP_MS,
    FENCED_MODEL, ...), so a deployment or a test sets them as before; each default is documented here only."""

    model_config = SettingsConfigDict(env_prefix="FENCED_", extra="ignore")

    # The stub model (examples/shopping/stub.py).
    stub_step_ms: int = Field(300, ge=0, description="Simulated model latency per step")
    stub_tokens: int = Field(800, ge=0, description="Tokens per stub model call (normal runs; large x3)")
    stub_count_paid: bool = Field(False, description="Count each stub call as paid in Redis (tests, chaos: the "
                                  "history checker holds recorded calls against it)")
    stub_tool_ms: int = Field(0, ge=0, description="Simulated latency of each demo tool call")

    # Which model plays the shopper.
    model: Literal["stub", "openai"] = Field("stub", description="'stub' or 'openai' (an OpenAI-compatible endpoint)")
    openai_base_url: str = Field("http://127.0.0.1:8000/v1")
    openai_api_key: str = Field("")
    openai_model: str = Field("gpt-4o-mini")

    # Cart cards (examples/shopping/cards.py).
    card_ttl_s: int = Field(1_800, gt=0, description="A cart card can be confirmed for this long")


@functools.cache
def get_shopping_settings() -> ShoppingSettings:
    """The demo's settings, read once per process from the environment (cache_clear() re-reads them, as
    for fenced's own settings). Raises ConfigError with one line per bad variable."""
    try:
        return ShoppingSettings()
    except ValidationError as exc:
        raise settings_error(exc) from None
