"""The public Agent API: schemas and argument checks from plain functions, and a user's agent on real workers
under a kill -9 and a freeze (the agent lives in tests/apps/support_agent.py, outside the package)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from checkpoints import billing, ledger, lifecycle, runs
from checkpoints.db import in_txn, transaction
from checkpoints.schema import effects
from fenced_agents import Agent, FunctionTool, InvalidArguments, effect, tool
from fenced_agents.model import AgentContext, Decision, ToolCall
from fenced_agents.openai_compat import OpenAICompatible
from fenced_core.errors import BudgetExceeded, TerminalError, TransientError
from fencing import events, faults
from fencing.connection import get_redis
from harness.verdict import check_run
from tasks import control, programs
from tasks.control import replay_dead_letter
from tests.apps import support_agent
from tests.workers_fixture import wait_for, wait_terminal, wait_zombie_refused

IMPORTS = {"FENCED_IMPORTS": "examples.shopping,tests.apps.support_agent"}


# -- schemas and arguments (no workers) -------------------------------------------------------------
def test_the_schema_comes_from_type_hints_and_the_docstring():
    spec = {t.name: t.spec() for t in support_agent.support.tools.values()}
    assert sorted(spec) == ["ask_user", "lookup_order", "refund", "refund_policy"], "ask_user is built in"
    refund = spec["refund"]
    assert refund["description"] == "Refund an order (money leaves the shop: once per run and amount)."
    params = refund["parameters"]
    assert params["required"] == ["order_id", "cents"], "ctx is not an argument the model sees"
    assert params["properties"]["cents"] == {"type": "integer", "exclusiveMinimum": 0, "maximum": 100_000,
                                             "description": "the amount, in cents."}
    assert params["additionalProperties"] is False
    assert spec["refund_policy"]["parameters"]["properties"]["reason"]["enum"] == ["damaged", "late", "changed_mind"]
    assert spec["ask_user"]["parameters"]["required"] == ["question"]


def test_each_spec_is_a_fresh_copy_a_model_may_change():
    tool = support_agent.support.tools["refund"]
    first = tool.spec()
    first["parameters"]["properties"].clear()
    assert tool.spec()["parameters"]["properties"], "a model that edits its copy must not edit the next step's"


def test_a_decision_records_every_field_it_has():
    """Checkpoint A stores to_dict(), built by hand for speed: a field added to Decision (or ToolCall)
    without it would be lost on every replay."""
    import dataclasses

    decision = Decision("search", "looking", [ToolCall("c1", "lookup_order", {"order_id": "A-1", "n": [1]})],
                        final=True, answer="ok", prompt_tokens=7, completion_tokens=3)
    assert decision.to_dict() == dataclasses.asdict(decision)
    assert Decision.from_dict(decision.to_dict()) == decision


def test_bad_arguments_name_each_field_and_never_reach_the_function():
    calls: list[Any] = []

    @tool
    def pick(sku: str, qty: int = 1) -> str:
        """Pick an item."""
        calls.append((sku, qty))
        return sku

    with pytest.raises(InvalidArguments) as exc:
        pick.validate({"sku": 7, "qty": "two", "colour": "red"})
    assert [p["field"] for p in exc.value.problems] == ["sku", "qty", "colour"]
    assert "qty: Input should be a valid integer" in str(exc.value) and "'two'" in str(exc.value)
    with pytest.raises(InvalidArguments, match="sku: Field required"):
        pick.validate({})
    assert pick.validate({"sku": "a", "qty": "3"}).qty == 3, "JSON-ish input is coerced to the hint's type"
    assert pick("direct") == "direct" and calls == [("direct", 1)], "a tool stays a callable function"


def test_a_bad_call_goes_back_to_the_model_as_the_tools_result():
    result = support_agent.refund.call({"order_id": "A-1", "cents": -5})  # no run needed: it never runs
    assert result["invalid_arguments"] == [{"field": "cents", "problem": "Input should be greater than 0 (got -5)"}]
    assert result["error"].startswith("invalid arguments, the tool did not run: refund: cents:")


def test_version_is_a_digest_of_the_tool_set_and_agents_register():
    @tool
    def a(x: int) -> int:
        """A."""
        return x

    @effect("send")
    def b(ctx: Any, to: str) -> str:
        """B."""
        return to

    one = Agent("api-test-one", model=support_agent.SupportModel(), tools=[a, b])
    two = Agent("api-test-two", model=support_agent.SupportModel(), tools=[a])
    assert programs.get("api-test-one") is one and len(one.version) == 12
    assert one.version != two.version
    before = two.version
    two.effect("send")(b.fn)
    assert two.version == one.version != before, "same tools, same version; adding one changes it"
    assert Agent("api-test-three", model=support_agent.SupportModel(), version="v7").version == "v7"
    with pytest.raises(ValueError, match="already"):
        two.effect("send", name="other_send")(lambda ctx, to: to)
    assert isinstance(b, FunctionTool) and b.kind == "effect" and not b.read_only and b.takes_ctx
    with pytest.raises(ValueError, match="a tool named 'a' already"):
        two.tool(name="a")(lambda x: x)

    @tool(name="ask_user")
    def own_ask(question: str, urgent: bool = False) -> str:
        """Ask, maybe urgently."""
        return question

    assert Agent("api-test-four", model=support_agent.SupportModel(), tools=[own_ask]).tools["ask_user"] is own_ask


# -- the OpenAI-compatible adapter against a local stand-in for the provider -----------------------
REPLIES: list[tuple[int, dict[str, Any]]] = []
SEEN: list[dict[str, Any]] = []


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
def provider() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), Provider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    REPLIES.clear()
    SEEN.clear()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


def test_openai_compatible_sends_instructions_history_and_tool_schemas(provider):
    model = OpenAICompatible("m-1", base_url=provider, api_key="k", max_tokens=64)
    agent = support_agent.support
    ctx = AgentContext("r1", "refund A-1", "normal", 1, [
        {"step": 0, "name": "lookup", "text": "", "results": {"c1": {"cents": 5}},
         "tool_calls": [{"id": "c1", "name": "lookup_order", "args": {"order_id": "A-1"}}]}],
        instructions=agent.instructions, tools=agent.tool_specs())
    REPLIES.append((200, {"choices": [{"message": {"content": None, "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "refund", "arguments": "{not json"}}]}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 9}}))
    d = model.decide(ctx)
    sent = SEEN[0]
    assert sent["max_tokens"] == 64 and sent["messages"][0] == {"role": "system", "content": agent.instructions}
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
    assert {t["function"]["name"] for t in sent["tools"]} == set(agent.tools)
    assert (d.prompt_tokens, d.completion_tokens, d.final) == (50, 9, False)
    assert d.tool_calls[0].args == {"__invalid_json__": "{not json"}
    assert "not a JSON object" in support_agent.refund.call(d.tool_calls[0].args)["error"]
    REPLIES.append((200, {"choices": [{"message": {"content": "Done."}}]}))
    assert model.decide(ctx).answer == "Done."
    for status, error in ((429, TransientError), (503, TransientError), (401, TerminalError)):
        REPLIES.append((status, {"error": "x"}))
        with pytest.raises(error):
            model.decide(ctx)
    assert "k" not in repr(model).replace("model", "")


# -- a user's agent on real workers ----------------------------------------------------------------
def refunds(run_id: str) -> int:
    return int(get_redis().get(f"fenced-test:refunds:{run_id}") or 0)


def effect_rows(run_id: str) -> list[Any]:
    with transaction(readonly=True) as conn:
        return list(conn.execute(sa.select(effects).where(effects.c.run_id == run_id)).all())


def assert_done_once(run_id: str, *, takeovers: int | None = None) -> None:
    v = check_run(run_id)
    assert v.ok, v.failures
    if takeovers is not None:
        assert v.takeovers == takeovers, v
    run = runs.get_run(run_id)
    assert run.agent == "support" and run.agent_version == support_agent.support.version
    assert refunds(run_id) == 1, "the refund was performed exactly once"
    assert [r.action for r in effect_rows(run_id)] == ["refund"]
    refund_results = [r for h in run.checkpoint["history"] for c in h["tool_calls"] if c["name"] == "refund"
                      for r in [h["results"][c["id"]]] if "refund_id" in r]
    assert len(refund_results) == 1 and run.answer.endswith(f"({refund_results[0]['refund_id']}).")


def test_a_users_agent_runs_to_done_on_a_worker(workers):
    workers.start("w1", **IMPORTS)
    run_id = support_agent.support.submit(user_id="u42", input="refund my order B-2002")
    wait_terminal([run_id], timeout=30)
    assert_done_once(run_id, takeovers=0)
    run = runs.get_run(run_id)
    assert [h["name"] for h in run.checkpoint["history"]] == ["lookup", "refund", "answer"]
    assert run.checkpoint["history"][0]["results"] == {
        c["id"]: r for c, r in zip(run.checkpoint["history"][0]["tool_calls"],
                                   [support_agent.lookup_order("B-2002"), "full refund"], strict=True)}


def test_the_model_fixes_its_own_bad_call(workers):
    workers.start("w1", **IMPORTS)
    run_id = support_agent.support.submit(user_id="u42", input="refund A-7 [badargs]")
    wait_terminal([run_id], timeout=30)
    assert_done_once(run_id)
    history = runs.get_run(run_id).checkpoint["history"]
    first = history[1]["results"][history[1]["tool_calls"][0]["id"]]
    assert first["invalid_arguments"][0]["field"] == "cents", first
    assert [h["name"] for h in history] == ["lookup", "refund", "refund", "answer"]


def test_ask_user_is_built_in_and_parks_the_run(workers):
    workers.start("w1", **IMPORTS)
    run_id = support_agent.support.submit(user_id="u42", input="refund my order [ask]")
    wait_for(lambda: runs.get_run(run_id).state == "waiting", 20, "the run to wait on the person")
    assert refunds(run_id) == 0
    control.reply_to_run(run_id, "C-3003", by="test")
    wait_terminal([run_id], timeout=30)
    assert_done_once(run_id)
    run = runs.get_run(run_id)
    assert run.answer.startswith("Refunded") and "order C-3003" in run.answer
    assert run.checkpoint["history"][0]["results"] == {run.checkpoint["history"][0]["tool_calls"][0]["id"]:
                                                       {"reply": "C-3003"}}


def _kill_holder(workers, point: str) -> str:
    _, run_id, pid = faults.next_hit(30) or pytest.fail(f"no worker reached {point}")
    workers.by_pid(pid).kill(signal.SIGKILL)
    return run_id


def test_sigkill_before_checkpoint_a_resumes_once(workers):
    workers.start("w1", **IMPORTS)
    workers.start("w2", **IMPORTS)
    faults.arm("after_model_call", action="hang")
    run_id = support_agent.support.submit(user_id="u42", input="refund A-1001")
    assert _kill_holder(workers, "after_model_call") == run_id
    wait_terminal([run_id], timeout=40)
    assert_done_once(run_id, takeovers=1)
    resumed = next(e for e in events.read(run_id) if e.type == "task_resumed")
    assert resumed.data["phase"] == "none", "killed after the model answered, before checkpoint A"


def test_sigkill_after_the_effect_replays_its_first_result(workers):
    slow = {**IMPORTS, "SUPPORT_STEP_MS": "400"}
    workers.start("w1", **slow)
    workers.start("w2", **slow)
    run_id = support_agent.support.submit(user_id="u42", input="refund A-1001")
    wait_for(lambda: (runs.get_run(run_id).step or 0) >= 1, 20, "step 1 (the refund step)")
    faults.arm("after_tools", action="hang")  # step 1's model call takes 400 ms: armed before its tools end
    assert _kill_holder(workers, "after_tools") == run_id
    wait_terminal([run_id], timeout=40)
    assert_done_once(run_id, takeovers=1)
    kinds = [e.kind for e in ledger.history(run_id)]
    assert "effect_reused" in kinds, "the new holder replayed checkpoint A and got the refund's first result"


def test_a_frozen_holder_past_its_lease_is_fenced_out_of_the_effect(workers):
    a = workers.start("a", **IMPORTS)
    faults.arm("before_effect", action="stop")  # the holder freezes itself just before the refund
    run_id = support_agent.support.submit(user_id="u42", input="refund A-1001")
    hit = faults.next_hit(30)
    assert hit and hit[1] == run_id and workers.by_pid(hit[2]) is a
    workers.start("b", **IMPORTS)
    try:
        wait_terminal([run_id], timeout=40)
    finally:
        a.kill(signal.SIGCONT)
    wait_zombie_refused(run_id, a, "effect")
    time.sleep(0.5)
    assert_done_once(run_id, takeovers=1)


def test_a_replay_naming_a_tool_the_agent_no_longer_has_is_refused(workers):
    workers.start("old", **IMPORTS)
    faults.arm("before_effect", action="hang")  # checkpoint A of step 1 (a refund) is written
    run_id = support_agent.support.submit(user_id="u42", input="refund A-1001")
    assert _kill_holder(workers, "before_effect") == run_id
    workers.start("new", **IMPORTS, SUPPORT_DROP_REFUND="1")
    [run] = wait_terminal([run_id], timeout=40)
    assert (run.state, run.error_class) == ("failed", "terminal")
    assert "['refund'] that agent 'support' no longer has" in run.error
    assert refunds(run_id) == 0 and effect_rows(run_id) == []


def test_runaway_agents_stop_at_max_steps_and_at_their_hold(workers):
    workers.start("w1", **IMPORTS)
    looping = support_agent.runaway.submit(user_id="u1", input="loop")
    hungry = support_agent.spender.submit(user_id="u2", input="spend")
    [loop_run, hungry_run] = wait_terminal([looping, hungry], timeout=40)
    held = billing.hold_credits("normal")

    assert (loop_run.state, loop_run.error_class, loop_run.model_calls) == ("failed", "max_steps", 3)
    # Step 3 would be its fourth model call: refused before the call (each call uses 400 tokens).
    assert check_run(looping).credits_charged == billing.credits_for(3 * 400, 0, held) == 6

    # Up to 1500 tokens per call, 1200 used each: after three calls (3600 tokens) the worst case of a fourth
    # (5100 tokens: 26 credits) exceeds the 20-credit hold, so it is not started.
    assert (hungry_run.state, hungry_run.error_class, hungry_run.model_calls) == ("failed", "budget", 3)
    assert check_run(hungry).credits_charged == 18 <= held
    for run_id, why in ((looping, "max_steps=3"), (hungry, "over the run's hold of 20")):
        [final] = [e for e in ledger.history(run_id) if e.kind == "failed"]
        assert why in final.reason and final.detail["charge"] <= held, final
        assert [e.type for e in events.read(run_id)][-1] == "run_failed"


def test_the_budget_counts_only_the_usage_a_reopened_hold_covers(mysql_store):
    """A dead letter replayed after its hold was settled gets a fresh hold for the tokens used since: the
    check holds the call against that, not against everything the run ever used."""
    run_id = runs.new_run_id()
    in_txn(runs.create_run_txn, run_id, "u9", "normal", "spend", "test", "spender", "")
    c = runs.claim(runs.get_run(run_id), "w/1")
    runs.write_decided(c, 0, {"decision": {}}, runs.Usage(2400, 800, 1), "")
    runs.dead_letter(c, "poison", {})
    in_txn(lifecycle.close_stale_holds_txn, runs.now_ms() + 10**9, "sweeper")  # settled: 16 credits
    runner = SimpleNamespace(step=1, run_id=run_id, run=runs.get_run(run_id), usage=runs.Usage(2400, 800, 1))
    # 3200 tokens used + up to 1500 = 24 credits > 20: refused while the closed hold is the run's only one.
    with pytest.raises(BudgetExceeded, match="could cost 24 credits"):
        support_agent.spender._bound(runner, support_agent.HungryModel())
    replay_dead_letter(run_id, "ops")  # a fresh hold of 20 for the usage from here on
    support_agent.spender._bound(runner, support_agent.HungryModel())
    runner.usage = runs.Usage(2400 + 2000, 800 + 600, 3)  # 2600 tokens since the replay + 1500 = 21 credits
    with pytest.raises(BudgetExceeded, match="could cost 21 credits"):
        support_agent.spender._bound(runner, support_agent.HungryModel())
