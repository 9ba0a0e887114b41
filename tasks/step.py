"""The step runner: one step of a claimed run, whatever program runs it, and every way a step ends.

A program (an agent's loop, a FencedTask's steps, an adapter) does the work through the runner:
`emit` appends events fenced by the epoch mirror, `boundary` stops a holder that lost its lease,
`with_retries` classifies and retries failures, `write_decided`/`step_done`/`finish` are the fenced
checkpoint and terminal writes. Failures the program raises end here: a StepError fails the run, a
FixableError or WaitForInput parks it, exhausted retries dead-letter it. What follows a terminal write
(slot, final event, hooks) is tasks.endings'.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from checkpoints import inputs, runs
from checkpoints.runs import Claim, Usage
from fenced_core.errors import (
    FencedOut,
    FixableError,
    LeaseLost,
    StepError,
    StoreUnavailable,
    TerminalError,
    TransientError,
    WaitForInput,
)
from fenced_core.settings import get_settings
from fencing import events, faults, scripts
from fencing.lease import Lease, now_ms
from fencing.watchdog import get_watchdog
from tasks import context, endings, hooks, metrics, programs

log = structlog.get_logger("tasks.step")

FINAL_EVENTS = events.FINAL_EVENTS  # re-exported: delivery and the CLI import it from here


@dataclass(frozen=True)
class Outcome:
    """How the step ended: `next_step` set means hand over to a continuation, unless `claimed` holds this
    delivery's claim of that step (claimed inline with checkpoint B: the delivery runs it next)."""

    state: str  # continue / done / failed / waiting / dead
    next_step: int | None = None
    claimed: Claim | None = None


class RetriesExhausted(Exception):
    """A transient failure outlived the step's retry budget."""


class StepRunner:
    """Runs the claimed step of one run; every durable write is fenced by the claim's epoch."""

    def __init__(self, claim: Claim, lease: Lease,
                 goes_on: Callable[[events.Appends], bool] = lambda _appends: False) -> None:
        self.c = claim
        self.lease = lease
        # Asked once the step's work is done: whether this delivery runs the next step too (tasks.delivery),
        # claiming it in checkpoint B's transaction. The step's step_done event rides with the renewal
        # that asks (`Appends.ids` set when it went out; else the step appends it itself).
        self.goes_on = goes_on
        self.settings = get_settings()
        run = claim.run
        self.run = run
        self.run_id = run.run_id
        self.step = run.step
        self.usage = Usage(run.prompt_tokens, run.completion_tokens, run.model_calls)
        # The finished steps as the program recorded them (the checkpoint's "history").
        self.history: list[dict[str, Any]] = list(run.checkpoint.get("history", []))
        # Set once the run has waited on a person: only then can a reply be in the program's context,
        # so only then is run_inputs read (no extra round trip on the hot path of other runs).
        self.waited = bool(run.checkpoint.get("waited"))
        self.decision: dict[str, Any] | None = run.checkpoint.get("decision") if run.phase == "decided" else None
        self.last_event_id = run.last_event_id
        # The Redis mirror of the epoch fences event appends; it is raised with this claim's first one.
        self.mirror_raised = False
        self.log = log.bind(run_id=self.run_id, epoch=claim.epoch, step=self.step)

    # -- what a program uses -----------------------------------------------------------------------
    def boundary(self) -> None:
        """Stop here if the watchdog lost the lease (the database would refuse us anyway)."""
        if self.lease.lost:
            raise LeaseLost(self.run_id)

    def emit(self, eid: str, type_: str, data: dict[str, Any] | None = None,
             riders: Sequence[scripts.Call | scripts.Command] = ()) -> events.Appends:
        """Append one event; the claim's first one also raises the epoch mirror (same round trip), and
        `riders` go in that round trip ahead of it (events.Appends.send; its `riders_ran` says whether
        they ran)."""
        return self.sent(self.event(eid, type_, data), riders)

    def event(self, eid: str, type_: str, data: dict[str, Any] | None = None) -> events.Appends:
        """One event of this step, to append (`sent`) or to ride with another round trip first."""
        return events.Appends(self.run_id, self.c.epoch, [(eid, type_, self.step, data or {})],
                              raise_mirror=not self.mirror_raised)

    def sent(self, appends: events.Appends,
             riders: Sequence[scripts.Call | scripts.Command] = ()) -> events.Appends:
        """Append `appends` (with `riders` ahead of them) unless another round trip carried them already
        (their ids are set)."""
        ids = appends.ids if appends.ids is not None else appends.send(riders=riders)
        self.last_event_id = ids[-1]
        self.mirror_raised = True
        return appends

    def replies(self) -> list[dict[str, Any]]:
        """A person's answers so far (question, reply), once the run has waited on one."""
        if not self.waited:
            return []
        return [{"question": i.question, "reply": i.reply} for i in inputs.for_run(self.run_id) if i.reply]

    def add_usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Count one paid model call; recorded by the next checkpoint."""
        self.usage = Usage(self.usage.prompt_tokens + prompt_tokens,
                           self.usage.completion_tokens + completion_tokens, self.usage.model_calls + 1)

    def with_retries(self, what: str, fn: Any) -> Any:
        """Retry transient failures with min(base * 2^n, cap) + jitter, within the step's budget.

        A StepError keeps its class; a store outage (StoreUnavailable: the database or Redis) counts as
        transient; any other exception from a model or tool is a bug in it and terminal."""
        s = self.settings
        for attempt in range(s.retry_budget + 1):
            try:
                return fn()
            except TransientError as exc:
                error: Exception = exc
            except StepError:
                raise
            except StoreUnavailable as exc:
                error = exc
            except Exception as exc:
                raise TerminalError(f"{what} raised {exc!r}") from exc
            if attempt == s.retry_budget:
                raise RetriesExhausted(f"{what}: {error} (after {attempt} retries)") from error
            delay_ms = min(s.retry_base_ms * 2**attempt, s.retry_cap_ms)
            delay_ms += random.uniform(0, delay_ms / 2)
            runs.record_fenced(self.c, "retry", f"{what} failed transiently: {error}; retry {attempt + 1} of "
                               f"{s.retry_budget} in {delay_ms:.0f} ms", {"class": "transient", "attempt": attempt + 1})
            self.log.warning("transient_retry", what=what, error=str(error), delay_ms=round(delay_ms))
            time.sleep(delay_ms / 1000)
            self.boundary()
        raise AssertionError("unreachable")

    def write_decided(self, decision: dict[str, Any]) -> None:
        """Checkpoint A: the step's paid decision and its usage; a resume replays it, never pays again."""
        faults.point("before_checkpoint_a", self.run_id)
        self.decision = decision
        with metrics.checkpoint_timer("A"):
            runs.write_decided(self.c, self.step, self.checkpoint(decision=decision), self.usage, self.last_event_id)

    def step_done(self, record: dict[str, Any], name: str) -> Outcome:
        """Checkpoint B: `record` joins the history, the run moves to the next step and is handed over."""
        self.boundary()
        # After the boundary: a holder frozen here (a chaos zombie) writes next, and the fence refuses it,
        # whether or not its watchdog found the lease lost first.
        faults.point("after_tools", self.run_id)
        self.history.append(record)
        done = self.event(f"s{self.step}:done", "step_done", {"name": name})
        goes_on = self.goes_on(done)  # the event rides with its renewal, when it makes one
        self.sent(done)
        claimed = None
        with metrics.checkpoint_timer("B"):
            if goes_on:
                claimed = runs.write_step_done_and_claim(self.c, self.step, self.checkpoint(), self.usage,
                                                         self.last_event_id)
            else:
                runs.write_step_done(self.c, self.step, self.checkpoint(), self.usage, self.last_event_id)
        self.log.info("step_done", inline_claim=claimed is not None)
        hooks.step_done(self.run_id, self.c.epoch, self.step, name)
        return Outcome("continue", next_step=self.step + 1, claimed=claimed)

    def finish(self, record: dict[str, Any] | None, answer: str) -> Outcome:
        """The run is done: its last record, its answer, settlement and the final event."""
        self.boundary()
        faults.point("after_tools", self.run_id)  # after the boundary, as in step_done
        if record is not None:
            self.history.append(record)
        with metrics.checkpoint_timer("terminal"):
            charge = runs.finish(self.c, "done", self.checkpoint(), self.usage, self.last_event_id, answer=answer)
        self._ended("done", {"answer": answer, "credits_charged": charge})
        self.log.info("run_done", credits=charge)
        faults.point("after_terminal_write", self.run_id)
        return Outcome("done")

    def checkpoint(self, **extra: Any) -> dict[str, Any]:
        """The checkpoint body every write stores: the finished steps, and whether the run ever waited."""
        return {"history": self.history, **({"waited": True} if self.waited else {}), **extra}

    # -- the step ----------------------------------------------------------------------------------
    def run_step(self) -> Outcome:
        run = self.c.run
        if self.c.takeover:
            self.emit(f"resume:{self.c.epoch}", "task_resumed", {
                "last_event_id": run.last_event_id, "previous_owner": self.c.previous_owner,
                "phase": run.phase, "step": self.step, "epoch": self.c.epoch,
            })
            if run.phase != "decided":
                self._note_a_lost_model_call()
        try:
            program = programs.get(run.agent)
            with context.running(context.RunContext(self.c, self.step)):
                return program.run_step(self)
        except RetriesExhausted as exc:
            return self._dead(str(exc))
        except FixableError as exc:
            return self._park(str(exc), f"fix:{self.step}:{self.c.epoch}", "fixable")
        except WaitForInput as wait:
            return self._park(wait.question, wait.tool_call_id, "ask_user")
        except StepError as exc:
            return self._fail(exc)

    def _note_a_lost_model_call(self) -> None:
        """A takeover before checkpoint A: if the old holder's model call for this step had answered (its
        decision event is in the stream), that call was paid and lost; say whose cost it is.

        Only the events after the run's last checkpoint are read: that checkpoint recorded the stream's
        newest event it covered, and any decision of this step by a lost holder came after it (the step
        began after that checkpoint). The read stays the size of one step, not of the run's history."""
        lost = [e for e in events.read(self.run_id, after=self.c.run.last_event_id)
                if e.eid == f"s{self.step}:decision" and e.epoch < self.c.epoch]
        if lost:
            runs.record_fenced(self.c, "model_call_lost",
                               f"the model call of step {self.step} by epoch {lost[-1].epoch} answered but was never "
                               "checkpointed (its holder was lost before checkpoint A): that call is the "
                               "platform's cost; the user is billed only for the calls checkpoint A records",
                               {"lost_epoch": lost[-1].epoch, "step": self.step})

    # -- endings -----------------------------------------------------------------------------------
    def _park(self, question: str, input_id: str, kind: str) -> Outcome:
        """Wait for a person: the question is recorded (once), the lease let go, then the run parks.

        The lease goes first (DESIGN: let go before anything can wake the run): a reply can land the
        moment `waiting` commits, and its wake-up must find the lease free. Our index entry stays until
        the park commits, so a crash in between is rescued by the reaper. `run_waiting` is emitted
        after the commit, so a client that replies on seeing it finds the run waiting."""
        if kind == "fixable":
            inputs.ask(self.c, input_id, self.step, question, kind="fixable")
        self.waited = True
        decided = {"decision": self.decision} if self.decision else {}  # a replay needs it
        get_watchdog(self.settings.heartbeat_ms).untrack(self.lease)
        self.lease.release(None, watch_until_ms=now_ms() + self.lease.ttl_ms)
        runs.park(self.c, question, self.checkpoint(**decided), self.usage, self.last_event_id)
        self.lease.unwatch()
        try:
            self.emit(f"wait:{input_id}", "run_waiting", {"question": question, "input_id": input_id, "kind": kind})
        except FencedOut:
            self.log.info("run_waiting_event_superseded")  # answered and claimed already: the run moved on
        self.log.info("run_waiting", kind=kind, input_id=input_id)
        return Outcome("waiting")

    def _fail(self, exc: StepError) -> Outcome:
        error_class = exc.failure_class
        charge = runs.finish(self.c, "failed", self.checkpoint(), self.usage, self.last_event_id,
                             error_class=error_class, error=str(exc))
        self._ended("failed", {"error_class": error_class, "error": str(exc), "credits_charged": charge})
        self.log.warning("run_failed", error_class=error_class, error=str(exc))
        return Outcome("failed")

    def _ended(self, state: str, data: dict[str, Any]) -> None:
        """After the terminal write committed: nothing of the run is left to fence, so the lease is no
        longer renewed (`untrack` waits out a renewal in flight, which could otherwise put back the index
        entry the release removes) and goes back with the slot in the final event's round trip."""
        faults.point("before_ending", self.run_id)
        get_watchdog(self.settings.heartbeat_ms).untrack(self.lease)
        endings.finished(self.c, state, data, self.emit, self.lease)

    def _dead(self, reason: str) -> Outcome:
        endings.dead_letter(self.c, reason, {"step": self.step, "history_steps": len(self.history)})
        return Outcome("dead")
