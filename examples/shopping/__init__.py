"""The demo shopping agent (plan -> search -> compare -> summarise, maybe an add-to-cart card).

Importing this module registers the agent `shopping` in the process: the worker imports it through
celeryconfig's `imports`."""

from __future__ import annotations

from agents.loop import AgentLoop
from agents.model import Model
from examples.shopping.settings import get_shopping_settings
from examples.shopping.tools import TOOLS
from tasks import programs


def get_model() -> Model:
    """The configured model (FENCED_MODEL): the deterministic stub, or an OpenAI-compatible endpoint."""
    if get_shopping_settings().model == "openai":
        from examples.shopping.openai_compat import OpenAICompatModel

        return OpenAICompatModel()
    from examples.shopping.stub import StubModel

    return StubModel()


shopping = AgentLoop("shopping", get_model, TOOLS, tool_delay_s=lambda: get_shopping_settings().stub_tool_ms / 1000)
programs.register(shopping)
