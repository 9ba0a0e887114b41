"""A model behind an OpenAI-compatible chat-completions endpoint (FENCED_MODEL=openai)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from agents.model import AgentContext, Decision, ToolCall
from examples.shopping.settings import get_shopping_settings
from examples.shopping.stub import STEPS
from fenced_core.errors import TerminalError, TransientError

_TOOLS = [
    {"type": "function", "function": {"name": "item_search", "description": "Search the catalog",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                    "required": ["query"]}}},
    {"type": "function", "function": {"name": "compare", "description": "Rank items by value",
     "parameters": {"type": "object", "properties": {"item_ids": {"type": "array", "items": {"type": "string"}}},
                    "required": ["item_ids"]}}},
    {"type": "function", "function": {"name": "add_to_cart", "description": "Offer a cart confirmation card",
     "parameters": {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object"}}},
                    "required": ["items"]}}},
]
SYSTEM = ("You are a shopping assistant. Use the tools to search, compare and, when the user asks to buy, "
          "add to cart. Answer without tools when you are done.")


class OpenAICompatModel:
    def __init__(self) -> None:
        s = get_shopping_settings()
        self.model = s.openai_model
        headers = {"Authorization": f"Bearer {s.openai_api_key}"} if s.openai_api_key else {}
        self.client = httpx.Client(base_url=s.openai_base_url, timeout=60, headers=headers)

    def decide(self, ctx: AgentContext) -> Decision:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": ctx.query}]
        for h in ctx.history:
            wire = [{"id": c["id"], "type": "function",
                      "function": {"name": c["name"], "arguments": json.dumps(c["args"])}} for c in h["tool_calls"]]
            messages.append({"role": "assistant", "content": h["text"], **({"tool_calls": wire} if wire else {})})
            for call_id, result in h["results"].items():
                messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)})
        try:
            resp = self.client.post("/chat/completions", json={"model": self.model, "messages": messages,
                                                               "tools": _TOOLS})
        except httpx.TransportError as exc:
            raise TransientError(f"model endpoint unreachable: {exc}") from None
        if resp.status_code == 429 or resp.status_code >= 500:
            raise TransientError(f"model endpoint answered {resp.status_code}")
        if resp.status_code >= 400:
            raise TerminalError(f"model endpoint refused the request: {resp.status_code} {resp.text[:200]}")
        body = resp.json()
        msg = body["choices"][0]["message"]
        usage = body.get("usage", {})
        calls = [ToolCall(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
                 for c in msg.get("tool_calls") or []]
        text = msg.get("content") or ""
        name = STEPS[min(ctx.step, len(STEPS) - 1)]
        return Decision(name, text, calls, final=not calls, answer=text if not calls else None,
                        prompt_tokens=int(usage.get("prompt_tokens", 0)),
                        completion_tokens=int(usage.get("completion_tokens", 0)))
