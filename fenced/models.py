"""The model seam, public: what a model receives (AgentContext), returns (Decision, ToolCall), and the adapters.

A model is any object with `decide(ctx: AgentContext) -> Decision` (see fenced_agents.model for the contract:
called again after a crash before checkpoint A, never after it). OpenAICompatible talks to any
OpenAI-compatible chat-completions endpoint.
"""

from __future__ import annotations

from fenced_agents.model import AgentContext, Decision, Model, ToolCall
from fenced_agents.openai_compat import OpenAICompatible

__all__ = ["AgentContext", "Decision", "Model", "OpenAICompatible", "ToolCall"]
