"""A pydantic-ai agent wrapped for fenced (tests/apps/pai_agent.py) on real workers: to done, under kill -9
of the holder mid-step, under a freeze past its lease, and parked on a question until a person replies."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.extras import require_extra

require_extra("pydantic_ai")  # skipped without the extra, except in scripts/test.sh (CI)

from checkpoints import billing, ledger, runs
from fencing import events, faults
from harness.verdict import check_run
from tasks.control import reply_to_run
from tests.adapter_cases import Adapter
from tests.apps.pai_agent import (
    charges_key,
    model_calls_key,
    pai_approve,
    pai_runaway,
    pai_shop,
    pai_short,
    pai_spender,
    pai_spender_default,
)
from tests.workers_fixture import wait_for, wait_terminal

IMPORTS = {"FENCED_IMPORTS": "examples.shopping,tests.apps.pai_agent"}


ADAPTER = Adapter(pai_shop, IMPORTS, model_calls_key, charges_key)
model_calls, charges, assert_promise = ADAPTER.model_calls, ADAPTER.charges, ADAPTER.assert_promise


def test_a_wrapped_agent_runs_to_done(workers):
    workers.start("w1", **IMPORTS)
    run_id = pai_shop.submit("u1", "buy a desk lamp")
    wait_terminal([run_id], timeout=40)
    run = assert_promise(run_id)
    assert run.agent == "pai_shop" and run.agent_version == "1"
    assert model_calls(run_id) == {0: 1, 1: 1, 2: 1}, "one model request per step"
    assert run.model_calls == 3 and run.prompt_tokens > 0
    # The checkpoint is pydantic-ai's own message history: request, response, tool returns ... answer.
    from fenced_agents.pydantic_ai import messages_of

    messages = messages_of(run.checkpoint["history"])
    assert [type(m).__name__ for m in messages] == ["ModelRequest", "ModelResponse"] * 3
    assert [h["name"] for h in run.checkpoint["history"]] == ["lookup", "charge", "answer"]


@pytest.mark.chaos
@pytest.mark.parametrize("point", ["after_model_call", "after_tools"])
def test_kill_9_of_the_holder_mid_step(workers, point):
    ADAPTER.kill_9_mid_step(workers, point)


@pytest.mark.chaos
def test_a_frozen_holder_is_fenced_out(workers):
    ADAPTER.frozen_holder_is_fenced_out(workers)


def test_a_tool_that_asks_parks_the_run_until_the_reply(workers):
    workers.start("w1", **IMPORTS)
    run_id = pai_shop.submit("u1", "[ask] buy a desk lamp")
    run = wait_for(lambda: (r := runs.get_run(run_id)) and r.state == "waiting" and r, 30, "the run to wait")
    assert run.error == "Which size?"
    reply_to_run(run_id, "large", "u1")
    wait_terminal([run_id], timeout=40)
    run = assert_promise(run_id)
    from fenced_agents.pydantic_ai import messages_of

    returns = [p.content for m in messages_of(run.checkpoint["history"]) for p in getattr(m, "parts", [])
               if type(p).__name__ == "ToolReturnPart" and p.tool_name == "ask_size"]
    assert returns == ["large"], "the reply is the tool's result"
    assert model_calls(run_id) == {0: 1, 1: 1, 2: 1, 3: 1}, "the parked step's response was replayed, not paid again"


def test_a_replay_naming_a_tool_the_agent_no_longer_has_is_refused(workers):
    """Checkpoint A of step 0 asks for `charge`; the holder dies before the charge; the worker that takes
    over runs a version of the agent without that tool: the run fails with a clear terminal error."""
    workers.start("old", **IMPORTS)
    faults.arm("before_effect")  # hangs after checkpoint A, before the charge
    run_id = pai_shop.submit("u1", "[pay-first] buy a desk lamp")
    hit = faults.next_hit(30)
    assert hit and hit[1] == run_id, hit
    workers.by_pid(hit[2]).kill(signal.SIGKILL)
    workers.start("new", **IMPORTS, PAI_DROP_CHARGE="1")
    [run] = wait_terminal([run_id], timeout=40)
    assert (run.state, run.error_class) == ("failed", "terminal")
    assert "['charge'] that agent 'pai_shop' no longer has" in (run.error or "")
    assert charges(run_id) == 0


def test_deferred_tools_fail_the_run_clearly(workers):
    workers.start("w1", **IMPORTS)
    run_id = pai_approve.submit("u1", "delete my account")
    [run] = wait_terminal([run_id], timeout=30)
    assert (run.state, run.error_class) == ("failed", "terminal")
    assert "deferred tool calls ['delete_account']" in (run.error or "")
    assert run.model_calls == 1, "the one paid request is billed"


def test_max_steps_stops_a_run_that_has_not_answered(workers):
    workers.start("w1", **IMPORTS)
    run_id = pai_short.submit("u1", "buy a desk lamp")
    [run] = wait_terminal([run_id], timeout=30)
    assert (run.state, run.error_class) == ("failed", "max_steps"), (run.state, run.error)
    assert model_calls(run_id) == {0: 1} and charges(run_id) == 0, "step 1 (the charge) never ran"


def test_runaways_stop_at_the_default_max_steps_and_at_their_hold(workers):
    """Runs that never answer: one at FencedAgent's default max_steps (8, fenced.Agent's), two against the
    20-credit hold at 1200 tokens a call. With max_tokens=2500 in the agent's model settings, a third call
    could cost (2400 + 2500 tokens) 25 credits; with none set, the estimate is bounds.DEFAULT_MAX_TOKENS
    (1024), so a fourth could cost (3600 + 1024) 24. Neither is sent; each run fails, charged at most its
    hold, with the reason in the ledger."""
    from fenced_agents import bounds

    workers.start("w1", **IMPORTS)
    looping = pai_runaway.submit("u1", "buy a desk lamp")
    capped = pai_spender.submit("u2", "buy a desk lamp")
    uncapped = pai_spender_default.submit("u3", "buy a desk lamp")
    [loop_run, capped_run, uncapped_run] = wait_terminal([looping, capped, uncapped], timeout=60)
    held = billing.hold_credits("normal")
    assert bounds.DEFAULT_MAX_TOKENS == 1024 and held == 20

    assert (loop_run.state, loop_run.error_class, loop_run.model_calls) == ("failed", "max_steps", 8), loop_run.error
    assert model_calls(looping) == {s: 1 for s in range(8)}, "no ninth request was sent"
    assert (capped_run.state, capped_run.error_class, capped_run.model_calls) == ("failed", "budget", 2)
    assert model_calls(capped) == {0: 1, 1: 1}, "the third request was not sent"
    assert (uncapped_run.state, uncapped_run.error_class, uncapped_run.model_calls) == ("failed", "budget", 3)
    assert model_calls(uncapped) == {0: 1, 1: 1, 2: 1}, "the fourth request was not sent"

    expected = {looping: ("max_steps=8", billing.credits_for(loop_run.prompt_tokens + loop_run.completion_tokens,
                                                             0, held)),
                capped: ("plus up to 2500 for this call could cost 25 credits, over the run's hold of 20", 12),
                uncapped: ("plus up to 1024 for this call could cost 24 credits, over the run's hold of 20", 18)}
    for run_id, (why, charge) in expected.items():
        assert check_run(run_id).credits_charged == charge <= held
        [final] = [e for e in ledger.history(run_id) if e.kind == "failed"]
        assert why in final.reason and final.detail["charge"] == charge, final
        types = [e.type for e in events.read(run_id)]
        assert types[-1] == "run_failed" and types.count("model_decision") == len(model_calls(run_id))


def test_a_fenced_agent_steps_like_our_agents_by_default():
    import inspect

    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.models.test import TestModel

    from fenced import Agent
    from fenced_agents.pydantic_ai import FencedAgent

    default = inspect.signature(Agent).parameters["max_steps"].default
    assert default == 8 and FencedAgent(PydanticAgent(TestModel(), name="pai_default")).max_steps == default
    assert FencedAgent(PydanticAgent(TestModel(), name="pai_unbounded"), max_steps=None).max_steps is None
    with pytest.raises(ValueError, match="max_steps must be at least 1"):
        FencedAgent(PydanticAgent(TestModel(), name="pai_zero"), max_steps=0)


def test_effects_must_name_tools_of_the_agent():
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    from fenced_agents.pydantic_ai import FencedAgent

    agent = Agent(TestModel(), name="pai_check")

    @agent.tool_plain
    def refund(order_id: str) -> str:
        """Refund an order."""
        return order_id

    with pytest.raises(ValueError, match=r"effects: \['refnud'\] are not tools of agent 'pai_check'"):
        FencedAgent(agent, effects={"refnud"})
    with pytest.raises(ValueError, match="needs a name"):
        FencedAgent(Agent(TestModel()))
    assert FencedAgent(agent, effects={"refund"}).effects == {"refund"}


def test_the_core_imports_without_pydantic_ai():
    """pydantic-ai is an optional extra: `agents` and `fenced` import with it missing."""
    code = "import sys; sys.modules['pydantic_ai'] = None; import fenced_agents, fenced, tasks; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
