"""The demo shopping agent (plan -> search -> compare -> summarise, maybe an add-to-cart card), on the public API.

Importing this module registers the agent `shopping` in the process: the worker imports it through
FENCED_IMPORTS (celeryconfig's `imports`). Its model is FENCED_MODEL: the deterministic stub
(examples/shopping/stub.py) or an OpenAI-compatible endpoint (FENCED_OPENAI_BASE_URL, _API_KEY, _MODEL).
Importing it also registers its cart cards (examples/shopping/cards.py) as the process's card provider,
which `fenced cards`, `fenced confirm` and the HTTP API reach through the service.
"""

from __future__ import annotations

import functools

from examples.shopping import cards
from examples.shopping.settings import get_shopping_settings
from examples.shopping.tools import TOOLS
from fenced import Agent, TerminalError, register_cards
from fenced.config import ConfigError
from fenced.models import Model, OpenAICompatible

INSTRUCTIONS = ("You are a shopping assistant. Use the tools to search, compare and, when the user asks to buy, "
                "add to cart. Answer without tools when you are done.")


def get_model() -> Model:
    """The configured model (FENCED_MODEL), made for each step from the settings as they are then.

    A bad demo setting on a worker (the CLI refuses it at start) fails the run as terminal, naming the
    variable: no delivery is retried for it, so it is never dead-lettered as a crash."""
    try:
        s = get_shopping_settings()
    except ConfigError as exc:
        raise TerminalError(f"the shopping agent's settings: {exc}") from None
    if s.model == "openai":
        return _openai(s.openai_model, s.openai_base_url, s.openai_api_key)
    from examples.shopping.stub import StubModel

    return StubModel()


@functools.cache
def _openai(model: str, base_url: str, api_key: str) -> OpenAICompatible:
    return OpenAICompatible(model, base_url=base_url, api_key=api_key)  # one HTTP client per endpoint


shopping = Agent("shopping", model=get_model, instructions=INSTRUCTIONS, max_steps=8, tools=TOOLS)
register_cards(cards)
