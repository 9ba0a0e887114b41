"""The OpenAI-compatible model adapter against a local HTTP stand-in for the provider (the outside world)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from agents.model import AgentContext
from examples.shopping.settings import get_shopping_settings
from fenced_core.errors import TerminalError, TransientError

REPLIES: list[tuple[int, dict]] = []
SEEN: list[dict] = []


class Provider(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        SEEN.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        status, body = REPLIES.pop(0)
        data = json.dumps(body).encode()
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
    get_shopping_settings.cache_clear()
    from examples.shopping import get_model

    REPLIES.clear()
    SEEN.clear()
    yield get_model()
    server.shutdown()
    get_shopping_settings.cache_clear()


CTX = AgentContext("r1", "buy headphones", "normal", 1, [
    {"step": 0, "name": "planner", "text": "plan", "results": {"call_1": [{"id": "sku-000"}]},
     "tool_calls": [{"id": "call_1", "name": "item_search", "args": {"query": "headphones"}}]},
])


def test_tool_calls_and_usage_are_parsed(model):
    REPLIES.append((200, {"choices": [{"message": {"content": "", "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "compare", "arguments": '{"item_ids": ["sku-000"]}'}}
    ]}}], "usage": {"prompt_tokens": 120, "completion_tokens": 30}}))
    d = model.decide(CTX)
    assert [(c.id, c.name, c.args) for c in d.tool_calls] == [("call_9", "compare", {"item_ids": ["sku-000"]})]
    assert (d.prompt_tokens, d.completion_tokens, d.final) == (120, 30, False)
    sent = SEEN[0]["messages"]
    assert sent[2]["tool_calls"][0]["id"] == "call_1" and sent[3]["tool_call_id"] == "call_1"


def test_a_reply_without_tools_is_the_final_answer(model):
    REPLIES.append((200, {"choices": [{"message": {"content": "Buy the Acme."}}], "usage": {}}))
    d = model.decide(CTX)
    assert d.final and d.answer == "Buy the Acme."


@pytest.mark.parametrize(("status", "error"), [(503, TransientError), (429, TransientError), (400, TerminalError)])
def test_provider_errors_are_classified(model, status, error):
    REPLIES.append((status, {"error": "x"}))
    with pytest.raises(error):
        model.decide(CTX)
