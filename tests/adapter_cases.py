"""What the agent-framework adapters' tests share (tests/test_pydantic_ai.py, tests/test_openai_agents.py):
the promise a finished run must keep, and the SIGKILL and freeze scenarios, for one adapter's test app.

Each test app defines a shopping agent that looks up, charges ([pay-first]: at step 0) and answers
"Bought a desk lamp for 25.99.", counting its model calls per step and its charges in Redis."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkpoints import runs
from fencing import events, faults
from fencing.connection import get_redis
from harness.verdict import check_run
from tests.workers_fixture import Pool, wait_terminal, wait_zombie_refused


@dataclass(frozen=True)
class Adapter:
    shop: Any  # the wrapped agent (has .submit(user_id, input))
    imports: dict[str, str]  # the workers' FENCED_IMPORTS
    model_calls_key: Callable[[str], str]
    charges_key: Callable[[str], str]

    def model_calls(self, run_id: str) -> dict[int, int]:
        return {int(k): int(v) for k, v in get_redis().hgetall(self.model_calls_key(run_id)).items()}

    def charges(self, run_id: str) -> int:
        return int(get_redis().get(self.charges_key(run_id)) or 0)

    def assert_promise(self, run_id: str) -> runs.Run:
        """Done, settled once, the effect once, each step's tools shown once in the live view."""
        run = runs.get_run(run_id)
        assert run is not None and run.state == "done", (run and run.state, run and run.error)
        assert run.answer == "Bought a desk lamp for 25.99."
        v = check_run(run_id)
        assert v.ok, v.failures
        assert self.charges(run_id) == 1, "the effect tool ran exactly once"
        view = events.live_view(events.read(run_id))
        shown = [(e.step, e.data["name"]) for e in view if e.type == "tool_started"]
        assert len(shown) == len(set(shown)), f"a tool is shown twice: {shown}"
        assert {name for _, name in shown} >= {"lookup", "charge"}
        return run

    def kill_9_mid_step(self, workers: Pool, point: str) -> None:
        """Step 0 charges ([pay-first]); its holder is SIGKILLed after the model answered (before
        checkpoint A: that call is lost and made again) or after the charge ran (after A: replayed,
        neither paid nor charged again)."""
        workers.start("a", **self.imports)
        workers.start("b", **self.imports)
        faults.arm(point)
        run_id = self.shop.submit("u1", "[pay-first] buy a desk lamp")
        hit = faults.next_hit(30)
        assert hit and hit[1] == run_id, hit
        workers.by_pid(hit[2]).kill(signal.SIGKILL)
        wait_terminal([run_id], timeout=40)
        run = self.assert_promise(run_id)
        resumed = [e for e in events.read(run_id) if e.type == "task_resumed"]
        assert len(resumed) == 1
        assert resumed[0].data["phase"] == ("none" if point == "after_model_call" else "decided")
        lost = 1 if point == "after_model_call" else 0
        assert self.model_calls(run_id) == {0: 1 + lost, 1: 1, 2: 1}, "the model is paid once per checkpointed step"
        assert run.model_calls == 3, "the user is billed for three calls"

    def frozen_holder_is_fenced_out(self, workers: Pool) -> None:
        """The holder freezes (SIGSTOP) after the charge ran, past its lease; b takes over from checkpoint
        A and finishes; woken, the zombie's checkpoint write is refused and nothing is charged twice."""
        a = workers.start("a", **self.imports)
        faults.arm("after_tools", action="stop")
        run_id = self.shop.submit("u1", "[pay-first] buy a desk lamp")
        hit = faults.next_hit(30)
        assert hit and hit[1] == run_id and workers.by_pid(hit[2]) is a, hit
        workers.start("b", **self.imports)
        try:
            wait_terminal([run_id], timeout=40)
        finally:
            a.kill(signal.SIGCONT)
        wait_zombie_refused(run_id, a)
        self.assert_promise(run_id)
        assert self.model_calls(run_id) == {0: 1, 1: 1, 2: 1}
