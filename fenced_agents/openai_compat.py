"""OpenAICompatible: a model behind any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, ...)."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import httpx

from fenced_agents.model import AgentContext, Decision, ToolCall
from fenced_core.errors import TerminalError, TransientError

RETRYABLE = (408, 409, 425, 429)  # and every 5xx


class OpenAICompatible:
    """One POST to `{base_url}/chat/completions` per step: the agent's instructions as the system message,
    the request, every finished step (the assistant's tool calls and their results), and the agent's
    tools as functions. A reply with tool calls is a step; a reply without is the final answer.

    `base_url` defaults to $OPENAI_BASE_URL or https://api.openai.com/v1, `api_key` to $OPENAI_API_KEY.
    `max_tokens` bounds each reply and is what the agent holds against the run's billing hold before
    the call. A timeout, a dropped connection, 408/409/425/429 or a 5xx raise TransientError (retried
    within the step's budget); any other 4xx or an unreadable reply raise TerminalError. The call is
    made before checkpoint A: after a crash or takeover there it is made again by the next holder."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None,
                 max_tokens: int = 1024, timeout_s: float = 60.0, temperature: float | None = None) -> None:
        if not model:
            raise ValueError("model must name the provider's model, e.g. 'gpt-4o-mini'")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, not {max_tokens!r}")
        self.model = model
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.temperature = temperature
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never the key
        return f"OpenAICompatible(model={self.model!r}, base_url={self.base_url!r})"

    def client(self) -> httpx.Client:
        """One HTTP client per model object, made on first use (in the worker, not at import)."""
        with self._lock:
            if self._client is None:
                headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
                self._client = httpx.Client(base_url=self.base_url, timeout=self.timeout_s, headers=headers)
            return self._client

    def request(self, ctx: AgentContext) -> dict[str, Any]:
        """The chat-completions request body for this step."""
        body: dict[str, Any] = {"model": self.model, "messages": messages(ctx), "max_tokens": self.max_tokens}
        if ctx.tools:
            body["tools"] = [{"type": "function", "function": spec} for spec in ctx.tools]
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    def decide(self, ctx: AgentContext) -> Decision:
        """One chat completion; see the class docstring for how failures are classified."""
        try:
            resp = self.client().post("/chat/completions", json=self.request(ctx))
        except httpx.TransportError as exc:
            raise TransientError(f"model endpoint unreachable: {exc!r}") from None
        if resp.status_code in RETRYABLE or resp.status_code >= 500:
            raise TransientError(f"model endpoint answered {resp.status_code}")
        if resp.status_code >= 400:
            raise TerminalError(f"model endpoint refused the request: {resp.status_code} {resp.text[:200]!r}")
        try:
            return parse(resp.json())
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise TerminalError(f"model endpoint sent an unreadable reply ({exc!r}): {resp.text[:200]!r}") from None


def messages(ctx: AgentContext) -> list[dict[str, Any]]:
    """The conversation so far, as chat messages."""
    out: list[dict[str, Any]] = []
    if ctx.instructions:
        out.append({"role": "system", "content": ctx.instructions})
    out.append({"role": "user", "content": ctx.query})
    for h in ctx.history:
        wire = [{"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c["args"])}} for c in h["tool_calls"]]
        out.append({"role": "assistant", "content": h.get("text") or None, **({"tool_calls": wire} if wire else {})})
        for c in h["tool_calls"]:
            if c["id"] in h["results"]:
                out.append({"role": "tool", "tool_call_id": c["id"], "content": json.dumps(h["results"][c["id"]])})
    return out


def parse(body: dict[str, Any]) -> Decision:
    """A chat-completions reply as a Decision; arguments that are not JSON reach the tool's validation as
    `{"__invalid_json__": raw}`, so the model is told and can retry."""
    msg = body["choices"][0]["message"]
    usage = body.get("usage") or {}
    calls = []
    for c in msg.get("tool_calls") or []:
        raw = c["function"].get("arguments") or "{}"
        try:
            args = json.loads(raw)
        except ValueError:
            args = None
        calls.append(ToolCall(str(c["id"]), str(c["function"]["name"]),
                              args if isinstance(args, dict) else {"__invalid_json__": raw}))
    text = msg.get("content") or ""
    name = "answer" if not calls else "+".join(sorted({c.name for c in calls}))[:64]
    return Decision(name, text, calls, final=not calls, answer=text if not calls else None,
                    prompt_tokens=int(usage.get("prompt_tokens") or 0),
                    completion_tokens=int(usage.get("completion_tokens") or 0))
