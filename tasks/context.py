"""The run a step is executing, for code running inside it: effects happen once, questions park the run.

Set by the step runner around a program's step (one delivery = one thread), so a tool, an effect or
a step function can reach the claim without having it passed through the user's code."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from checkpoints import effects, inputs
from checkpoints.runs import Claim
from fenced_core.errors import WaitForInput
from fencing import faults


@dataclass(frozen=True)
class RunContext:
    """The holder's view of its run: what it may read, and the claim its effects are fenced by.

    It belongs to one delivery: after a crash or a takeover the new holder gets its own, with a higher
    `epoch`, and effects (`once`) and questions (`ask_user`) made through the old one are refused once
    the new claim exists. `run_id`, `user_id` and `input` never change across takeovers."""

    claim: Claim
    step: int
    call_id: str | None = None  # the tool call being run (agents), None in a task's step

    @property
    def run_id(self) -> str:
        return self.claim.run.run_id

    @property
    def epoch(self) -> int:
        return self.claim.epoch

    @property
    def user_id(self) -> str:
        return self.claim.run.user_id

    @property
    def input(self) -> str:
        return self.claim.run.query


_current: ContextVar[RunContext | None] = ContextVar("fenced_run", default=None)


def current() -> RunContext:
    """The run this code is executing in (public as `fenced.current_run`); RuntimeError outside a fenced
    step. After a crash or a takeover the code runs again under the new holder's context (a new epoch):
    never keep one across steps."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("not inside a fenced run: effects and ask_user run only in an agent's tool or a "
                           "FencedTask's step")
    return ctx


def active() -> RunContext | None:
    return _current.get()


@contextmanager
def running(ctx: RunContext) -> Iterator[RunContext]:
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


def once(action: str, payload: Any, perform: Callable[[str], Any]) -> Any:
    """Run `perform(idempotency_key)` once per (run, action, payload) and return its first result.

    The result is recorded in the same fenced transaction as the effect's bookkeeping: a holder that
    was fenced out records nothing, and a replay (after a crash, a takeover or by a zombie) gets the
    first result back without running `perform` again. `perform` runs inside that transaction: if it
    calls the outside world, pass the key on (a payment provider's idempotency key), because a crash
    after the call and before the commit runs it again with the same key. Its result must be JSON."""
    ctx = current()
    if not action or len(action) > 64:
        raise ValueError(f"an effect's action must be 1 to 64 characters, not {action!r}")
    faults.point("before_effect", ctx.run_id)
    result, _reused = effects.perform_once(ctx.claim, action, payload, lambda _conn, key: perform(key))
    return result


def ask_user(question: str, input_id: str | None = None) -> str:
    """The person's answer to `question`: the first time, the run parks (waiting) until they reply; on
    the replay after the reply, the stored answer is returned. `input_id` names the question (the tool
    call id in an agent; the step in a task) and must be the same on the replay. The question is stored
    and the run parked in one fenced write: after a crash or a takeover it is asked once, and a reply
    that came in meanwhile is the answer the new holder gets."""
    ctx = current()
    key = input_id or ctx.call_id or f"step{ctx.step}"
    answer = inputs.ask(ctx.claim, key, ctx.step, question)
    if answer is None:
        raise WaitForInput(question, key)
    return answer
