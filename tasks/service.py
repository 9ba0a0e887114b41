"""What a front end offers on runs (status, list, events, ledger, cancel, reply, replay), scoped to a caller.

The CLI and the HTTP API call these and only parse and print, so both answer alike. `user_id` is the
caller: None is an operator (every run); a user sees only their own runs, and another user's run is
RunNotFound exactly as a missing one is, so run ids cannot be probed. Every answer is a plain
dataclass (or a list of them) that `dataclasses.asdict` turns into JSON-ready data.

Only reads and the operations of tasks.control are here: nothing writes the stores directly, so a
front end crashing or taken over mid-call leaves what those operations leave (each is one database
transaction, then idempotent Redis follow-ups). An example's own operations live with the example
(the shopping demo's cart cards and confirm: examples/shopping/cards.py).
"""

from __future__ import annotations

import base64
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import redis

from checkpoints import billing, history, inputs, ledger, lifecycle, runs
from checkpoints.db import transaction
from checkpoints.ledger import Entry
from checkpoints.lifecycle import Cancelled, DeadLetter
from checkpoints.schema import RUN_STATES, TERMINAL_STATES, run_checkpoints
from fenced_core.errors import InvalidRequest, RunNotFound
from fencing import events as ev
from tasks import control

FINAL_EVENT_IDS = frozenset(eid for eid, _type in ev.FINAL_EVENTS.values())
MAX_PAGE = 10_000


@dataclass(frozen=True)
class RunSummary:
    """A run row as it is now, without its checkpoint blob (`steps_done`: steps in the checkpoint)."""

    run_id: str
    user_id: str
    kind: str
    query: str
    agent: str
    agent_version: str
    state: str
    epoch: int
    owner: str | None
    step: int
    phase: str
    prompt_tokens: int
    completion_tokens: int
    model_calls: int
    last_event_id: str
    deliveries: int
    total_deliveries: int
    answer: str | None
    error_class: str | None
    error: str | None
    created_at_ms: int
    updated_at_ms: int
    finished_at_ms: int | None
    steps_done: int

    @classmethod
    def of(cls, run: runs.Run, **extra: Any) -> Any:
        data = {f.name: getattr(run, f.name) for f in fields(cls) if hasattr(run, f.name)}
        return cls(**data, steps_done=history.length(run.checkpoint), **extra)

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL_STATES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunView(RunSummary):
    """One run for its status: the row, its billing hold(s) with the charge, and the question it waits on."""

    holds: list[dict[str, Any]] = field(default_factory=list)
    question: inputs.Input | None = None  # set while the run is `waiting` on a person


@dataclass(frozen=True)
class RunStatus:
    """`fenced status`: the run, its last ledger entries (of `ledger_entries`), its stored event count
    (None: Redis unreachable)."""

    run: RunView
    ledger: list[Entry]
    ledger_entries: int
    events: int | None


@dataclass(frozen=True)
class RunPage:
    """A page of runs, newest first; `next_cursor` continues after it (None: no more)."""

    runs: list[RunSummary]
    next_cursor: str | None


@dataclass(frozen=True)
class EventPage:
    """Events of a run: the live view (superseded half-steps dropped, deduplicated) or as stored;
    `stored` counts what the stream holds in the same range (so `stored - len(events)` were hidden)."""

    events: list[ev.Event]
    stored: int


def _scoped(run: runs.Run | None, user_id: str | None, run_id: str) -> runs.Run:
    if run is None or (user_id is not None and run.user_id != user_id):
        raise RunNotFound(f"no run with id {run_id!r}")
    return run


def resolve_id(text: str, user_id: str | None = None) -> str:
    """The run id `text` names: the id itself, or the only run id starting with it (4+ hex characters).
    RunNotFound when none (of this caller's) matches; InvalidRequest when the prefix is ambiguous."""
    run = runs.peek_run(text)
    if run is not None and (user_id is None or run.user_id == user_id):
        return run.run_id
    if re.fullmatch(r"[0-9a-fA-F-]{4,63}", text):
        rc = run_checkpoints.c
        query = run_checkpoints.select().with_only_columns(rc.run_id).where(rc.run_id.startswith(text.lower()))
        if user_id is not None:
            query = query.where(rc.user_id == user_id)
        with transaction(readonly=True) as conn:
            ids = conn.execute(query.limit(2)).scalars().all()
        if len(ids) == 1:
            return str(ids[0])
        if len(ids) > 1:
            raise InvalidRequest(f"run id prefix {text!r} is ambiguous")
    raise RunNotFound(f"no run with id {text!r}")


def get_run(run_id: str, user_id: str | None = None) -> RunView:
    """The run as its row says now, with its holds and (when waiting) its unanswered question."""
    run = _scoped(runs.get_run(run_id), user_id, run_id)
    question = None
    if run.state == "waiting":
        question = next((i for i in reversed(inputs.for_run(run_id)) if i.reply is None), None)
    return RunView.of(run, holds=billing.holds_for(run_id), question=question)


def status(run_id: str, user_id: str | None = None, ledger_tail: int = 10) -> RunStatus:
    """get_run plus the last `ledger_tail` ledger entries and the number of stored events."""
    view = get_run(run_id, user_id)
    entries = ledger.history(run_id)
    try:
        count: int | None = len(ev.read(run_id))
    except redis.RedisError:
        count = None
    return RunStatus(view, entries[-ledger_tail:] if ledger_tail else [], len(entries), count)


def _cursor(run: runs.Run) -> str:
    return base64.urlsafe_b64encode(f"{run.created_at_ms}:{run.run_id}".encode()).decode()


def _uncursor(cursor: str) -> tuple[int, str]:
    try:
        at, run_id = base64.urlsafe_b64decode(cursor.encode()).decode().split(":", 1)
        return int(at), run_id
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest(f"cursor {cursor!r} is not one this service returned") from None


def list_runs(user_id: str | None = None, state: str | None = None, limit: int = 20,
              cursor: str | None = None) -> RunPage:
    """The caller's runs (an operator: everyone's), newest first, `limit` per page, optionally in one state."""
    if state is not None and state not in RUN_STATES:
        raise InvalidRequest(f"state must be one of {', '.join(RUN_STATES)}, not {state!r}")
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be 1 to {MAX_PAGE}, not {limit}")
    found = runs.list_runs(limit=limit + 1, state=state, user_id=user_id,
                           before=_uncursor(cursor) if cursor else None)
    page = found[:limit]
    return RunPage([RunSummary.of(r) for r in page], _cursor(page[-1]) if len(found) > limit else None)


def events(run_id: str, user_id: str | None = None, after: str | None = None, raw: bool = False) -> EventPage:
    """The run's events: the live view, or every entry as stored with `raw`. With `after` (a stream
    id from an earlier answer): only entries appended since, as stored; a client merges them by `eid`
    (a replayed event reuses its id). Raises redis errors when Redis is unreachable."""
    if after is not None and not re.fullmatch(r"\d{1,20}(-\d{1,20})?", after):
        raise InvalidRequest(f"after must be a stream id like 1700000000000-0, not {after!r}")
    _scoped(runs.peek_run(run_id), user_id, run_id)
    stream = ev.read(run_id, after=after or "-")
    if after:
        return EventPage(stream, len(stream))
    return EventPage(stream if raw else ev.live_view(stream), len(stream))


def ledger_of(run_id: str, user_id: str | None = None) -> list[Entry]:
    """Every decision recorded for the run, with its reason, oldest first."""
    _scoped(runs.peek_run(run_id), user_id, run_id)
    return ledger.history(run_id)


def cancel(run_id: str, by: str, user_id: str | None = None) -> Cancelled:
    """Cancel the run (tasks.control.cancel_run): it ends `cancelled`, what was used is settled, its
    holder is fenced out. A finished run is a no-op (`noop`). Retried after a crash: idempotent."""
    _scoped(runs.peek_run(run_id), user_id, run_id)
    return control.cancel_run(run_id, by, user_id=user_id)


def reply(run_id: str, text: str, by: str, user_id: str | None = None) -> inputs.Input:
    """Answer the question the waiting run asked; it is queued and woken (tasks.control.reply_to_run).
    InvalidRequest (nothing written) when it is not waiting or the text is empty."""
    if not text.strip():
        raise InvalidRequest("the reply must not be empty")
    _scoped(runs.peek_run(run_id), user_id, run_id)
    return control.reply_to_run(run_id, text, by, user_id=user_id)


def dead_letters(limit: int = 50, include_revived: bool = False) -> list[DeadLetter]:
    """Operators only: runs dead now, newest first (`include_revived`: every case file ever written)."""
    return lifecycle.dead_letters_list(limit, include_revived)


def dead_letter(run_id: str) -> DeadLetter:
    """Operators only: a dead letter's case file (InvalidRequest when the run never was dead-lettered)."""
    return lifecycle.dead_letter(run_id)


def replay_dead_letter(run_id: str, by: str) -> int:
    """Operators only: replay a dead run from its last checkpoint (tasks.control.replay_dead_letter);
    returns the step it resumes. Admitted and paid like a new run; a refusal writes nothing."""
    return control.replay_dead_letter(run_id, by)
