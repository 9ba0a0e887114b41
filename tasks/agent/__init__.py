"""The demo shopping agent: model interface, stub and OpenAI-compatible models, catalog and tools."""

from __future__ import annotations

from fenced.settings import get_settings
from tasks.agent.model import Model


def get_model() -> Model:
    """The configured model (FENCED_MODEL): the deterministic stub, or an OpenAI-compatible endpoint."""
    if get_settings().model == "openai":
        from tasks.agent.openai_compat import OpenAICompatModel

        return OpenAICompatModel()
    from tasks.agent.stub import StubModel

    return StubModel()
