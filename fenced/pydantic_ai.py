"""`from fenced.pydantic_ai import FencedAgent`: a pydantic-ai agent behind fenced (the pydantic-ai extra)."""

from fenced_agents.pydantic_ai import FencedAgent

__all__ = ["FencedAgent"]
