"""The programs a worker can run, by name. A run row names its program (`agent`); an Agent, a FencedTask
or an adapter registers one here when its module is imported (`celery -A ... worker` imports them
through the app, or FENCED_IMPORTS names them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import structlog

from fenced_core.errors import TerminalError

if TYPE_CHECKING:
    from tasks.step import Outcome, StepRunner

log = structlog.get_logger("tasks.programs")


class Program(Protocol):
    """What the step runner runs: one step of a claimed run, through the runner's fenced writes.

    `run_step` ends in exactly one of the runner's endings (`step_done`, `finish`) or raises a
    StepError/WaitForInput that the runner turns into a failure or a park. It runs after the claim and
    may run again for the same step after a crash: anything it does before its checkpoint must be safe
    to repeat (read-only, or through `tasks.context.once`)."""

    name: str
    version: str  # of its tool set or steps; "" = not checked on replay

    def run_step(self, runner: StepRunner) -> Outcome: ...


_programs: dict[str, Program] = {}


def register(program: Program) -> None:
    """Make `program` runnable in this process under its name (a later registration replaces it)."""
    if not program.name or len(program.name) > 128:
        raise ValueError(f"a program name must be 1 to 128 characters, not {program.name!r}")
    old = _programs.get(program.name)
    if old is not None and old is not program:
        log.info("program_replaced", name=program.name)
    _programs[program.name] = program


def get(name: str) -> Program:
    """The program a run names; a TerminalError (the run fails, with this reason) if this worker has none."""
    program = _programs.get(name)
    if program is None:
        known = ", ".join(sorted(_programs)) or "none"
        raise TerminalError(f"no agent or task named {name!r} is registered in this worker (registered: {known}); "
                            "import the module that defines it in the worker (celery -A, or FENCED_IMPORTS)")
    return program


def lookup(name: str) -> Program | None:
    return _programs.get(name)


def names() -> list[str]:
    return sorted(_programs)
