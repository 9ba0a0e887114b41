"""The shopping example on an OpenAI-compatible endpoint (FENCED_MODEL=openai): fenced_agents.openai_compat's
OpenAICompatible against a local HTTP stand-in for the provider (the outside world), configured from the
example's FENCED_OPENAI_* settings and shown the agent's instructions and tools."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from examples.shopping import get_model, shopping
from examples.shopping.settings import get_shopping_settings
from fenced_agents.model import AgentContext
from fenced_agents.openai_compat import OpenAICompatible
from fenced_core.errors import TerminalError, TransientError

REPLIES: list[tuple[int, dict]] = []
SEEN: list[tuple[dict, dict]] = []  # (headers, body) of each request


class Provider(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        SEEN.append(({k.lower(): v for k, v in self.headers.items()}, body))
        status, reply = REPLIES.pop(0)
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    server = HTTPServer(("127.0.0.1", 0), Provider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("FENCED_MODEL", "openai")
    monkeypatch.setenv("FENCED_OPENAI_BASE_URL", f"http://127.0.0.1:{server.server_port}/v1")
    monkeypatch.setenv("FENCED_OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("FENCED_OPENAI_MODEL", "shop-model-1")
    get_shopping_settings.cache_clear()
    REPLIES.clear()
    SEEN.clear()
    yield get_model()
    server.shutdown()
    monkeypatch.undo()
    get_shopping_settings.cache_clear()


# What the agent loop passes the model at step 1: the agent's instructions and tools, the finished step 0.
CTX = AgentContext("r1", "buy headphones", "normal", 1, [
    {"step": 0, "name": "planner", "text": "plan", "results": {"call_1": [{"id": "sku-000"}]},
     "tool_calls": [{"id": "call_1", "name": "item_search", "args": {"query": "headphones"}}]},
], instructions=shopping.instructions, tools=shopping.tool_specs())


def test_the_example_talks_to_the_configured_endpoint_with_its_instructions_and_tools(model):
    assert isinstance(model, OpenAICompatible)
    REPLIES.append((200, {"choices": [{"message": {"content": "", "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "compare", "arguments": '{"item_ids": ["sku-000"]}'}}
    ]}}], "usage": {"prompt_tokens": 120, "completion_tokens": 30}}))
    d = model.decide(CTX)
    assert [(c.id, c.name, c.args) for c in d.tool_calls] == [("call_9", "compare", {"item_ids": ["sku-000"]})]
    assert (d.prompt_tokens, d.completion_tokens, d.final) == (120, 30, False)
    headers, sent = SEEN[0]
    assert headers["authorization"] == "Bearer sk-test" and sent["model"] == "shop-model-1"
    assert sent["messages"][0] == {"role": "system", "content": shopping.instructions}
    assert sent["messages"][2]["tool_calls"][0]["id"] == "call_1" and sent["messages"][3]["tool_call_id"] == "call_1"
    tools = {t["function"]["name"]: t["function"] for t in sent["tools"]}
    assert sorted(tools) == ["add_to_cart", "ask_user", "compare", "item_search"]
    assert tools["add_to_cart"]["parameters"]["properties"]["items"]["items"]["properties"]["qty"]["maximum"] == 99


def test_a_reply_without_tools_is_the_final_answer(model):
    REPLIES.append((200, {"choices": [{"message": {"content": "Buy the Acme."}}], "usage": {}}))
    d = model.decide(CTX)
    assert d.final and d.answer == "Buy the Acme."


@pytest.mark.parametrize(("status", "error"), [(503, TransientError), (429, TransientError), (400, TerminalError)])
def test_provider_errors_are_classified(model, status, error):
    REPLIES.append((status, {"error": "x"}))
    with pytest.raises(error):
        model.decide(CTX)


def test_a_bad_model_setting_on_a_worker_fails_the_run_naming_the_variable(settings_env):
    assert get_shopping_settings().model == "stub"  # cached: settings_env must clear the example's cache too
    settings_env(model="antropic")
    with pytest.raises(TerminalError, match=r"FENCED_MODEL='antropic'.*'stub' or 'openai'"):
        get_model()
