"""The exception tree of fenced. Fencing and cancellation are BaseExceptions: user code cannot swallow them."""

from __future__ import annotations


class FencedError(Exception):
    """Base of every ordinary error raised by fenced."""


class ConfigError(FencedError):
    """Settings that cannot work together."""


class RunNotFound(FencedError):
    """No run has this id."""


class InvalidRequest(FencedError):
    """Bad input from a caller; nothing was written."""


class IdempotencyConflict(InvalidRequest):
    """An idempotency key already named another request (another input, kind or agent); nothing was
    written. Use a new key for a new request."""


class InsufficientCredits(InvalidRequest):
    """The user's available credits (balance - open holds) cannot cover the run's hold; nothing was written."""

    def __init__(self, user_id: str, needed: int, available: int) -> None:
        super().__init__(f"user {user_id!r} has {available} credits available; the run needs a hold of {needed}")
        self.user_id, self.needed, self.available = user_id, needed, available

    def __reduce__(self) -> tuple[type, tuple[str, int, int]]:
        return type(self), (self.user_id, self.needed, self.available)


class AdmissionRefused(FencedError):
    """Too many runs wait already (`limit` "global"), the user has too many unfinished runs ("user"), or
    admission could not be checked ("unavailable"). Nothing was written: retry after `retry_after_s`."""

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
    idempotent), and a step that meets one is taken over from its last checkpoint."""


class StepError(FencedError):
    """Base of errors a model call or a tool raises, by failure class."""

    failure_class = "terminal"


class TransientError(StepError):
    """Worth retrying: a timeout, a 5xx, a dropped connection."""

    failure_class = "transient"


class FixableError(StepError):
    """Needs input from a person (bad tool input the model cannot repair, missing information)."""

    failure_class = "fixable"


class TerminalError(StepError):
    """Retrying cannot help: the run fails and what was used is settled."""

    failure_class = "terminal"


class BudgetExceeded(TerminalError):
    """The run's next model call could cost more than its billing hold has left: it is not started, and
    the run fails, settled at most its hold."""

    failure_class = "budget"


class MaxStepsExceeded(TerminalError):
    """The agent took its `max_steps` steps without a final answer: the run fails (a runaway loop stops)."""

    failure_class = "max_steps"


class Interrupt(BaseException):
    """Base of signals that end a step at once and must not be swallowed by `except Exception`."""


class FencedOut(Interrupt):
    """A newer claim exists: this holder's write was refused. Stop without any terminal write."""

    def __init__(self, run_id: str, epoch: int, what: str) -> None:
        super().__init__(f"run {run_id}: epoch {epoch} fenced out at {what}")
        self.run_id, self.epoch, self.what = run_id, epoch, what


class LeaseLost(Interrupt):
    """The watchdog could not renew the lease: stop at the next boundary."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id}: lease lost")
        self.run_id = run_id


class WaitForInput(Interrupt):
    """A tool needs a person's answer: the run parks in `waiting`; the reply wakes it."""

    def __init__(self, question: str, tool_call_id: str) -> None:
        super().__init__(question)
        self.question, self.tool_call_id = question, tool_call_id
