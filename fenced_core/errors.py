"""The exception tree of fenced. Fencing and cancellation are BaseExceptions: user code cannot swallow them."""

from __future__ import annotations


class FencedError(Exception):
    """Base of every ordinary error raised by fenced."""


class ConfigError(FencedError):
    """Settings that cannot work together (or one that cannot work): raised at start-up, before a worker
    consumes or a command writes anything, so no crash or takeover ever meets a half-applied setting."""


class RunNotFound(FencedError):
    """No run has this id (or not one the caller may see). Nothing was written; a crash or a takeover
    never removes a run row, so a run that existed is found again after either."""


class InvalidRequest(FencedError):
    """Bad input from a caller; nothing was written. It is decided before any write, so a crash or a
    takeover cannot leave part of a refused request behind."""


class IdempotencyConflict(InvalidRequest):
    """An idempotency key already named another request (another input, kind or agent); nothing was
    written. Use a new key for a new request. The key is stored with the run in the submit's transaction,
    so a client that crashed after sending can retry with the same key and get the same run; a takeover
    of that run by another worker changes nothing about it."""


class InsufficientCredits(InvalidRequest):
    """The user's available credits (balance - open holds) cannot cover the run's hold; nothing was written.
    Holds are taken and settled in fenced transactions, so a crash or a takeover never charges twice or
    leaves a hold open past the run's end."""

    def __init__(self, user_id: str, needed: int, available: int) -> None:
        super().__init__(f"user {user_id!r} has {available} credits available; the run needs a hold of {needed}")
        self.user_id, self.needed, self.available = user_id, needed, available

    def __reduce__(self) -> tuple[type, tuple[str, int, int]]:
        return type(self), (self.user_id, self.needed, self.available)


class AdmissionRefused(FencedError):
    """Too many runs wait already (`limit` "global"), the user has too many unfinished runs ("user"), or
    admission could not be checked ("unavailable"). Nothing was written: retry after `retry_after_s`.
    A slot taken for a submit that crashed before its row committed is given back by the sweeper (it never blocks a
    user for good), and a takeover of an admitted run keeps its one slot."""

    def __init__(self, limit: str, retry_after_s: float, message: str) -> None:
        super().__init__(message)
        self.limit, self.retry_after_s = limit, retry_after_s

    def __reduce__(self) -> tuple[type, tuple[str, float, str]]:
        return type(self), (self.limit, self.retry_after_s, str(self))


class StoreUnavailable(FencedError):
    """A store (the run database, Redis) could not be reached, or kept failing transiently: translated
    once where a driver error enters fenced (checkpoints.db for the database, fencing.connection for
    Redis), each subclass also keeping its driver's type so older handlers still match. Retrying later
    may succeed: a write that raised it either committed whole or not at all (fenced writes are
    idempotent), and a step that meets one is taken over from its last checkpoint, as after a crash."""


class StepError(FencedError):
    """Base of errors a model call or a tool raises, by failure class."""

    failure_class = "terminal"


class TransientError(StepError):
    """Worth retrying: a timeout, a 5xx, a dropped connection. Retried with backoff within the step's
    budget (each retry in the ledger), then the run is dead-lettered. A crash or a takeover during the
    retries resumes the step from its last checkpoint: a decision already recorded is not asked again."""

    failure_class = "transient"


class FixableError(StepError):
    """Needs input from a person (bad tool input the model cannot repair, missing information): the run
    parks in `waiting` with the message as its question. The park is one fenced write, so after a crash
    or a takeover the run is either still running the step or waiting, never both."""

    failure_class = "fixable"


class TerminalError(StepError):
    """Retrying cannot help: the run fails and what was used is settled, in one fenced terminal write;
    a crash before it re-runs the step from its checkpoint, and a holder taken over cannot write it."""

    failure_class = "terminal"


class BudgetExceeded(TerminalError):
    """The run's next model call could cost more than its billing hold has left: it is not started, and
    the run fails, settled at most its hold. Usage is read from the checkpoint, so after a crash or a
    takeover the check counts every call already paid for."""

    failure_class = "budget"


class MaxStepsExceeded(TerminalError):
    """The agent took its `max_steps` steps without a final answer: the run fails (a runaway loop stops).
    Steps are counted from the checkpoint, so a crash or a takeover never gives a run extra steps."""

    failure_class = "max_steps"


class Interrupt(BaseException):
    """Base of signals that end a step at once and must not be swallowed by `except Exception`."""


class FencedOut(Interrupt):
    """A newer claim exists (a takeover): this holder's write was refused and nothing of it landed. Stop
    without any terminal write. A BaseException, so user code's `except Exception` cannot swallow it; the
    new holder resumes from the last checkpoint written before the takeover. A holder that crashed never
    sees it: its run is taken over the same way."""

    def __init__(self, run_id: str, epoch: int, what: str) -> None:
        super().__init__(f"run {run_id}: epoch {epoch} fenced out at {what}")
        self.run_id, self.epoch, self.what = run_id, epoch, what


class LeaseLost(Interrupt):
    """The watchdog could not renew the lease: stop at the next boundary. Whatever this holder still
    writes is fenced by its epoch, so a takeover that happened meanwhile refuses it (FencedOut)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id}: lease lost")
        self.run_id = run_id


class WaitForInput(Interrupt):
    """A tool needs a person's answer: the run parks in `waiting`; the reply wakes it."""

    def __init__(self, question: str, tool_call_id: str) -> None:
        super().__init__(question)
        self.question, self.tool_call_id = question, tool_call_id
