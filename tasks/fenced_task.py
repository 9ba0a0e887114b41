"""FencedTask and @step: durable multi-step Celery tasks that are not LLM loops, on the same runtime as agents.

```python
@step
def fetch(order_id: str) -> dict: ...

@step
def refund(order: dict) -> dict:
    return once("refund", order, lambda key: payments.refund(order["id"], idempotency_key=key))

@app.task(base=FencedTask)
def refund_order(order_id: str) -> str:
    order = fetch(order_id)          # step 0
    receipt = refund(order)          # step 1: sees step 0's result
    return receipt["id"]             # the run's answer (JSON)

handle = refund_order.delay("o-1")  # a fenced run (lease, epoch claim, checkpoints); handle.id is its run id
```

How it runs: each delivery re-executes the task body from the top. A `@step` call that a checkpoint
already holds returns the recorded result without running; the first step with no checkpoint runs,
and the delivery stops at the next `@step` call (or at the body's return): checkpoint B records the
result, and the next step is its own chained wake-up message. So a finished step never runs again, a
step's result is what the next step sees, and each step can land on another worker.

What a crash does: a step interrupted before its checkpoint runs again in full on the next delivery
(at least once), so a step that writes to the outside world does it through `once` (exactly once per
run, action and payload, fenced by the epoch). The body between steps runs at every delivery: keep it
deterministic and free of side effects, and call the steps in the same order every time (a replay
whose step names differ from the checkpoints fails the run with a clear terminal error).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from celery import Task

from fenced_core.errors import InvalidRequest, TerminalError
from tasks import programs

if TYPE_CHECKING:
    from tasks.result import RunResult
    from tasks.step import Outcome, StepRunner

P = ParamSpec("P")
R = TypeVar("R")


class _StepFinished(BaseException):
    """The delivery's one new step has run and the body asked for the next: end the delivery here.
    A BaseException, so the user's `except Exception` between steps cannot swallow it."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(record["name"])
        self.record = record


@dataclass
class _Cursor:
    """Where the re-executed body is: the next @step call's index, and the step this delivery ran."""

    runner: StepRunner
    index: int = 0
    ran: dict[str, Any] | None = field(default=None)


_cursor: ContextVar[_Cursor | None] = ContextVar("fenced_step_cursor", default=None)


def step(fn: Callable[P, R]) -> Callable[P, R]:
    """Make `fn` a checkpointed step of the FencedTask that calls it.

    Inside a fenced run the call returns the checkpointed result if this step already finished (it does
    not run again), or runs it once for this delivery; its result must be JSON. Transient failures
    (`TransientError`, a database outage) are retried within the step's budget; a `TerminalError` or
    any other exception fails the run; a `FixableError` parks it for a person. Outside a fenced run (a
    unit test calling the body) it is a plain call.

    Under a crash: a step whose result was checkpointed is never run again; one that was running when
    its worker died runs again from its start (make its outside effects `once`). Under a takeover: the
    old holder's checkpoint write is refused (its epoch is stale), so the result the next step sees is
    the one the current holder recorded."""
    name = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def checkpointed(*args: P.args, **kwargs: P.kwargs) -> R:
        cursor = _cursor.get()
        if cursor is None:
            return fn(*args, **kwargs)
        runner = cursor.runner
        if cursor.ran is not None:
            raise _StepFinished(cursor.ran)  # the next step is the next delivery's
        index, cursor.index = cursor.index, cursor.index + 1
        if index < len(runner.history):
            recorded = runner.history[index]
            if recorded.get("name") != name:
                raise TerminalError(f"step {index} was checkpointed as {recorded.get('name')!r} but the task now "
                                    f"calls {name!r} there: its steps must run in the same order at every delivery")
            return recorded["result"]
        runner.emit(f"s{index}:start", "step_started", {"name": name})
        runner.boundary()
        result = runner.with_retries(f"step {name}", lambda: fn(*args, **kwargs))
        try:
            json.dumps(result)
        except (TypeError, ValueError) as exc:
            raise TerminalError(f"step {name} returned {type(result).__name__}, which is not JSON: {exc}") from None
        cursor.ran = {"step": index, "name": name, "result": result}
        return result

    checkpointed.__fenced_step__ = name  # type: ignore[attr-defined]
    return checkpointed


@contextmanager
def _executing(runner: StepRunner) -> Iterator[_Cursor]:
    cursor = _Cursor(runner)
    token = _cursor.set(cursor)
    try:
        yield cursor
    finally:
        _cursor.reset(token)


class _TaskProgram:
    """The step runner's program for one FencedTask: replay the body up to its first unfinished step."""

    version = ""  # a changed task is caught by the step names recorded in its checkpoints

    def __init__(self, name: str, body: Callable[..., Any]) -> None:
        self.name = name
        self.body = body

    def run_step(self, runner: StepRunner) -> Outcome:
        call = json.loads(runner.run.query)
        with _executing(runner) as cursor:
            try:
                value = self.body(*call.get("args", []), **call.get("kwargs", {}))
            except _StepFinished as finished:
                return runner.step_done(finished.record, finished.record["name"])
        try:
            answer = json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise TerminalError(f"task {self.name} returned {type(value).__name__}, which is not JSON: {exc}") from None
        return runner.finish(cursor.ran, answer)


@dataclass(frozen=True)
class RunHandle:
    """A submitted fenced run: `id` is its run id (also the Celery task id of its first wake-up).

    Only the id is held: the handle outlives the submitting process, and reading through it after a
    worker's crash or a takeover shows committed state only (the run's last checkpoint, the answer its
    fenced terminal write stored once)."""

    id: str

    def wait(self, timeout_s: float | None = None) -> RunResult:
        """Block until the run ends (or waits on a person); its state, answer (JSON text) and error."""
        from tasks.result import wait

        return wait(self.id, timeout_s)

    def result(self) -> Any:
        """The task's return value once the run is done (parsed from the JSON answer); None before."""
        from tasks.result import result

        answer = result(self.id).answer
        return None if answer is None else json.loads(answer)


class FencedTask(Task):
    """A Celery task base class for durable multi-step jobs: `@app.task(base=FencedTask)`.

    `.delay(*args, **kwargs)` / `.apply_async(args, kwargs, user_id=..., idempotency_key=...)` do not
    send the body to a worker as one message: they create a fenced run (its row, billing hold and
    admission, all-or-nothing) and send its first wake-up; the run's steps (@step) then run as chained
    wake-ups under a lease and an epoch claim, exactly as an agent's steps do (see the module docstring
    for what a crash and a takeover do). Arguments must be JSON. Calling the task directly (`task(...)`)
    runs the body in this process without fencing, as a unit test would."""

    abstract = True
    ignore_result = True
    typing = False  # the body's arguments are checked when the run is submitted (JSON), not by Celery

    @classmethod
    def on_bound(cls, app: Any) -> None:
        if cls.__dict__.get("abstract") or not cls.name:
            return
        name = cls.name
        # Through the registered instance: a `bind=True` body gets its task as `self`, as in Celery.
        programs.register(_TaskProgram(name, lambda *args, **kwargs: app.tasks[name].run(*args, **kwargs)))

    def apply_async(self, args: Any = None, kwargs: Any = None, *, user_id: str = "system",
                    idempotency_key: str | None = None, kind: str = "normal", **options: Any) -> RunHandle:
        """Create a fenced run of this task and wake it; returns its handle. Celery's scheduling options
        (countdown, eta, queue, ...) are not supported: a TypeError names them, nothing is written."""
        if options:
            raise TypeError(f"FencedTask.apply_async does not support {sorted(options)}; a fenced run is "
                            "routed and scheduled by fenced")
        from tasks.submit import submit_run

        call = {"args": list(args or ()), "kwargs": dict(kwargs or {})}
        try:
            query = json.dumps(call)
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(f"{self.name}: arguments must be JSON ({exc})") from None
        return RunHandle(submit_run(user_id, query, kind, idempotency_key, agent=self.name))

    def delay(self, *args: Any, **kwargs: Any) -> RunHandle:
        """`apply_async(args, kwargs)` for the system user: create the run, return its handle."""
        return self.apply_async(args, kwargs)
