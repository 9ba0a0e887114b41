"""An OpenAI Agents SDK agent wrapped for fenced (tests/apps/oa_agent.py, its own `Model`, no network) on real
workers: to done, under kill -9 of the holder mid-step, under a freeze past its lease, parked on a question
until a person replies, and stopped by its bounds."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.extras import require_extra

require_extra("agents")  # skipped without the extra, except in scripts/test.sh (CI)

from checkpoints import billing, ledger, runs
from fencing import faults
from fencing.connection import get_redis
from harness.verdict import check_run
from tasks.control import reply_to_run
from tests.adapter_cases import Adapter
from tests.apps.oa_agent import (
    charges_key,
    guards_key,
    model_calls_key,
    oa_approve,
    oa_runaway,
    oa_shop,
    oa_short,
    oa_spender,
)
from tests.workers_fixture import wait_for, wait_terminal

IMPORTS = {"FENCED_IMPORTS": "examples.shopping,tests.apps.oa_agent"}


ADAPTER = Adapter(oa_shop, IMPORTS, model_calls_key, charges_key)
model_calls, charges, assert_promise = ADAPTER.model_calls, ADAPTER.charges, ADAPTER.assert_promise


def test_a_wrapped_agent_runs_to_done(workers):
    workers.start("w1", **IMPORTS)
    run_id = oa_shop.submit("u1", "buy a desk lamp")
    wait_terminal([run_id], timeout=40)
    run = assert_promise(run_id)
    assert run.agent == "oa_shop" and run.agent_version == "1"
    assert model_calls(run_id) == {0: 1, 1: 1, 2: 1}, "one model call per step"
    assert run.model_calls == 3 and run.prompt_tokens == 150 and run.completion_tokens == 30
    # The checkpoint is the SDK's input list: the user's input, the calls and their outputs, the answer.
    from fenced_agents.openai_agents import items_of

    items = items_of(run.checkpoint["history"])
    kinds = [i.get("type") or i.get("role") for i in items]
    assert kinds == ["user", "function_call", "function_call_output", "message", "function_call",
                     "function_call_output", "message"], kinds
    assert [h["name"] for h in run.checkpoint["history"]] == ["lookup", "charge", "answer"]
    assert int(get_redis().get(guards_key(run_id)) or 0) == 1, "input guardrails run once, on step 0"


@pytest.mark.chaos
@pytest.mark.parametrize("point", ["after_model_call", "after_tools"])
def test_kill_9_of_the_holder_mid_step(workers, point):
    ADAPTER.kill_9_mid_step(workers, point)


@pytest.mark.chaos
def test_a_frozen_holder_is_fenced_out(workers):
    ADAPTER.frozen_holder_is_fenced_out(workers)


def test_a_tool_that_asks_parks_the_run_until_the_reply(workers):
    workers.start("w1", **IMPORTS)
    run_id = oa_shop.submit("u1", "[ask] buy a desk lamp")
    run = wait_for(lambda: (r := runs.get_run(run_id)) and r.state == "waiting" and r, 30, "the run to wait")
    assert run.error == "Which size?"
    reply_to_run(run_id, "large", "u1")
    wait_terminal([run_id], timeout=40)
    run = assert_promise(run_id)
    from fenced_agents.openai_agents import items_of

    items: list[dict] = list(items_of(run.checkpoint["history"]))  # type: ignore[arg-type]
    outputs = [i["output"] for i in items
               if i.get("type") == "function_call_output" and str(i.get("call_id")).endswith("_ask_size")]
    assert outputs == ["large"], "the reply is the tool's result"
    assert model_calls(run_id) == {0: 1, 1: 1, 2: 1, 3: 1}, "the parked step's response was replayed, not paid again"


def test_a_replay_naming_a_tool_the_agent_no_longer_has_is_refused(workers):
    """Checkpoint A of step 0 asks for `charge`; the holder dies before the charge; the worker that takes
    over runs a version of the agent without that tool: the run fails with a clear terminal error."""
    workers.start("old", **IMPORTS)
    faults.arm("before_effect")  # hangs after checkpoint A, before the charge
    run_id = oa_shop.submit("u1", "[pay-first] buy a desk lamp")
    hit = faults.next_hit(30)
    assert hit and hit[1] == run_id, hit
    workers.by_pid(hit[2]).kill(signal.SIGKILL)
    workers.start("new", **IMPORTS, OA_DROP_CHARGE="1")
    [run] = wait_terminal([run_id], timeout=40)
    assert (run.state, run.error_class) == ("failed", "terminal")
    assert "['charge'] that agent 'oa_shop' no longer has" in (run.error or "")
    assert charges(run_id) == 0


def test_approvals_fail_the_run_clearly(workers):
    workers.start("w1", **IMPORTS)
    run_id = oa_approve.submit("u1", "delete my account")
    [run] = wait_terminal([run_id], timeout=30)
    assert (run.state, run.error_class) == ("failed", "terminal")
    assert "stopped for approval of ['delete_account']" in (run.error or ""), run.error
    assert run.model_calls == 1, "the one paid call is billed"


def test_max_steps_stops_a_run_that_has_not_answered(workers):
    workers.start("w1", **IMPORTS)
    run_id = oa_short.submit("u1", "buy a desk lamp")
    [run] = wait_terminal([run_id], timeout=30)
    assert (run.state, run.error_class) == ("failed", "max_steps"), (run.state, run.error)
    assert model_calls(run_id) == {0: 1} and charges(run_id) == 0, "step 1 (the charge) never ran"


def test_runaways_stop_at_the_default_max_steps_and_at_their_hold(workers):
    """Runs that never answer: one at the default max_steps (8), one against the 20-credit hold at 1200
    tokens a call with max_tokens=2500 in its model settings: a third call could cost (2400 + 2500 tokens)
    25 credits, so it is not sent. Each run fails, charged at most its hold, with the reason in the ledger."""
    workers.start("w1", **IMPORTS)
    looping = oa_runaway.submit("u1", "buy a desk lamp")
    spending = oa_spender.submit("u2", "buy a desk lamp")
    [loop_run, spend_run] = wait_terminal([looping, spending], timeout=60)
    held = billing.hold_credits("normal")
    assert held == 20
    assert (loop_run.state, loop_run.error_class, loop_run.model_calls) == ("failed", "max_steps", 8), loop_run.error
    assert model_calls(looping) == {s: 1 for s in range(8)}, "no ninth call was made"
    assert (spend_run.state, spend_run.error_class, spend_run.model_calls) == ("failed", "budget", 2), spend_run.error
    assert model_calls(spending) == {0: 1, 1: 1}, "the third call was not made"
    [final] = [e for e in ledger.history(spending) if e.kind == "failed"]
    assert "plus up to 2500 for this call could cost 25 credits, over the run's hold of 20" in final.reason
    for run_id in (looping, spending):
        assert (check_run(run_id).credits_charged or 0) <= held


def test_the_wrapper_checks_its_agent():
    from agents import Agent, function_tool

    from fenced_agents.openai_agents import FencedOpenAIAgent
    from tests.apps.oa_agent import ShopModel

    @function_tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        return order_id

    agent = Agent(name="oa_check", model=ShopModel(), tools=[refund])
    with pytest.raises(ValueError, match=r"effects: \['refnud'\] are not function tools of agent 'oa_check'"):
        FencedOpenAIAgent(agent, effects={"refnud"})
    with pytest.raises(ValueError, match="has handoffs"):
        FencedOpenAIAgent(Agent(name="oa_triage", model=ShopModel(), handoffs=[agent]))
    with pytest.raises(ValueError, match="max_steps must be at least 1"):
        FencedOpenAIAgent(agent, max_steps=0)
    assert FencedOpenAIAgent(agent, effects={"refund"}).effects == {"refund"}
    assert FencedOpenAIAgent(agent).max_steps == 8


def test_the_core_imports_without_openai_agents():
    """openai-agents is an optional extra: `fenced_agents`, `fenced` and `tasks` import with it missing."""
    code = "import sys; sys.modules['agents'] = None; import fenced_agents, fenced, tasks; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
