"""The agent layer: agents from a model and plain functions, on the step runner's programs.

`Agent`, `tool`, `effect` and `ToolContext` are the public names (re-exported by `fenced`); the model
seam is fenced_agents.model, the OpenAI-compatible adapter fenced_agents.openai_compat. Adapters for other agent
frameworks (fenced_agents.pydantic_ai) are optional extras and are not imported here.
"""

from fenced_agents.agent import Agent
from fenced_agents.tools import FunctionTool, InvalidArguments, ToolContext, effect, tool

__all__ = ["Agent", "FunctionTool", "InvalidArguments", "ToolContext", "effect", "tool"]
