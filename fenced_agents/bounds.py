"""The bounds of a run, checked before each model call by every agent program (AgentLoop, FencedAgent).

A runaway agent stops in one of two ways, both before the model call that would cross the bound, so
nothing is paid for that call:

- `max_steps`: the run is at step `max_steps` (it has made that many model calls without a final answer):
  MaxStepsExceeded, the run fails with class `max_steps`;
- the billing hold: the call's most expensive outcome, the usage the run recorded so far plus the call's
  `max_tokens`, priced as the settlement prices it, is more than the run's hold: BudgetExceeded, the run
  fails with class `budget`.

Both are TerminalErrors: the step runner fails the run, settles its recorded usage (capped at the hold,
as every settlement is) and writes the error, the reason, to the ledger's `failed` entry.

Under a crash or a takeover the check is made again by the new holder from what the run's row recorded
(its step and its usage, both written with the checkpoints), so a takeover can neither skip the bound nor
move it: a step that reached checkpoint A is replayed without a model call and without a check; one that
had not is checked again before its call. The usage of a call lost in a crash (made, never checkpointed)
is the platform's and does not count against the user's hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from checkpoints import billing
from fenced_core.errors import BudgetExceeded, MaxStepsExceeded

if TYPE_CHECKING:
    from tasks.step import StepRunner

#: The most a pydantic-ai model call is assumed to use when its `model_settings` set no `max_tokens`
#: (the OpenAICompatible model's default too). It is only an estimate: the provider is not limited by it.
DEFAULT_MAX_TOKENS = 1024


def valid_max_steps(max_steps: int | None) -> int | None:
    """`max_steps` as given, refused (ValueError) below 1; None means no step limit."""
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(f"max_steps must be at least 1, not {max_steps!r}")
    return max_steps


def check(runner: StepRunner, agent: str, max_steps: int | None, max_tokens: int) -> None:
    """Refuse the model call a runaway run would make next: past `max_steps`, or over the billing hold.

    `max_tokens` is the most the call can use (0 when unknown: then only a run whose recorded usage
    already costs more than its hold stops). The hold is the run kind's; only when the estimate exceeds
    it is the hold row read (no extra round trip on the hot path): a dead letter replayed after its hold
    was closed has a fresh hold that covers only the tokens used since it was reopened."""
    if max_steps is not None and runner.step >= max_steps:
        raise MaxStepsExceeded(f"agent {agent!r} took its max_steps={max_steps} steps without a final answer; "
                               "no further model call was made")
    estimate = max(0, int(max_tokens or 0))
    held = billing.hold_credits(runner.run.kind)
    total = runner.usage.prompt_tokens + runner.usage.completion_tokens
    worst = billing.credits_for(total + estimate, 0, 2**62)
    if worst > held:
        for hold in billing.holds_for(runner.run_id)[:1]:
            held = int(hold["credits_held"])
            worst = billing.credits_for(max(total - int(hold["tokens_settled_before"]), 0) + estimate, 0, 2**62)
    if worst > held:
        raise BudgetExceeded(f"step {runner.step}: the model call was not started: {total} tokens used so far "
                             f"plus up to {estimate} for this call could cost {worst} credits, over the run's "
                             f"hold of {held}")
