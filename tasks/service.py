"""What a front end offers on runs (status, list, events, ledger, cards, confirm, cancel, reply, replay),
scoped to a caller.

The CLI and the HTTP API call these and only parse and print, so both answer alike. `user_id` is the
caller: None is an operator (every run); a user sees only their own runs, and another user's run is
RunNotFound exactly as a missing one is, so run ids cannot be probed. Every answer is a plain
dataclass (or a list of them) that `dataclasses.asdict` turns into JSON-ready data.

Only reads and the operations of tasks.control are here: nothing writes the stores directly, so a
front end crashing or taken over mid-call leaves what those operations leave (each is one database
transaction, then idempotent Redis follow-ups).

An app adds its own extras through a seam: `register_cards(provider)` (the shopping example registers
its cart cards when it is imported) makes `cards_for`, `get_card` and `confirm_card` answer with the
app's cards, so the front ends never import an app. With none registered, a run has no cards and a card
id names none (CardNotFound).

Store errors leave as StoreUnavailable (a subclass per store, translated where the driver is called):
a front end answers "try again later", and every operation here is safe to retry.
"""

from __future__ import annotations

import base64
import importlib
import re
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

import structlog

from checkpoints import billing, history, inputs, ledger, lifecycle, runs
from checkpoints.db import transaction
from checkpoints.ledger import Entry
from checkpoints.lifecycle import Cancelled, DeadLetter
from checkpoints.schema import RUN_STATES, TERMINAL_STATES, run_checkpoints
from fenced_core.errors import InvalidRequest, RunNotFound, StoreUnavailable
from fenced_core.settings import get_settings
from fencing import events as ev
from tasks import control

log = structlog.get_logger("tasks.service")

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
    RunNotFound when none (of this caller's) matches; InvalidRequest when the prefix is ambiguous. Reads only."""
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
    """The run as its row says now, with its holds and (when waiting) its unanswered question.

    Committed state only: after a crash the row shows the last checkpoint (the step a takeover resumes),
    and during a takeover `epoch` and `owner` name the newest claim; a fenced-out holder's writes never show."""
    run = _scoped(runs.get_run(run_id), user_id, run_id)
    question = None
    if run.state == "waiting":
        question = next((i for i in reversed(inputs.for_run(run_id)) if i.reply is None), None)
    return RunView.of(run, holds=billing.holds_for(run_id), question=question)


def status(run_id: str, user_id: str | None = None, ledger_tail: int = 10) -> RunStatus:
    """get_run plus the last `ledger_tail` ledger entries and the number of stored events (None when Redis
    is unreachable: the row, from the database, still answers). Reads only, as get_run."""
    view = get_run(run_id, user_id)
    entries = ledger.history(run_id)
    try:
        count: int | None = len(ev.read(run_id))
    except StoreUnavailable:  # Redis unreachable (fencing's client raises RedisUnavailable): the row still shows
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
    """The caller's runs (an operator: everyone's), newest first, `limit` per page, optionally in one state.
    Reads committed rows only; a cursor stays valid across crashes and takeovers (it names a row, not a worker)."""
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
    (a replayed event reuses its id). Raises StoreUnavailable when Redis is unreachable. Reads only:
    safe during a takeover (a superseded half step is hidden from the live view) and after any crash."""
    if after is not None and not re.fullmatch(r"\d{1,20}(-\d{1,20})?", after):
        raise InvalidRequest(f"after must be a stream id like 1700000000000-0, not {after!r}")
    _scoped(runs.peek_run(run_id), user_id, run_id)
    stream = ev.read(run_id, after=after or "-")
    if after:
        return EventPage(stream, len(stream))
    return EventPage(stream if raw else ev.live_view(stream), len(stream))


def ledger_of(run_id: str, user_id: str | None = None) -> list[Entry]:
    """Every decision recorded for the run, with its reason, oldest first: takeovers, fence rejections and
    crashes' replays included (each entry committed with the write it explains)."""
    _scoped(runs.peek_run(run_id), user_id, run_id)
    return ledger.history(run_id)


def cancel(run_id: str, by: str, user_id: str | None = None) -> Cancelled:
    """Cancel the run (tasks.control.cancel_run): it ends `cancelled`, what was used is settled, its
    holder is fenced out. A finished run is a no-op (`noop`). Retried after a crash: idempotent. The cancel
    takes an epoch of its own (mirrored in Redis before it commits), so the holder, or one taking it over
    meanwhile, is fenced out of every later write."""
    _scoped(runs.peek_run(run_id), user_id, run_id)
    return control.cancel_run(run_id, by, user_id=user_id)


def reply(run_id: str, text: str, by: str, user_id: str | None = None) -> inputs.Input:
    """Answer the question the waiting run asked; it is queued and woken (tasks.control.reply_to_run).
    InvalidRequest (nothing written) when it is not waiting or the text is empty. The reply and the run's
    return to `queued` commit together; a crash before the wake-up leaves a queued run the sweeper wakes,
    and a retry after a lost answer is refused (already answered), writing nothing."""
    if not text.strip():
        raise InvalidRequest("the reply must not be empty")
    _scoped(runs.peek_run(run_id), user_id, run_id)
    return control.reply_to_run(run_id, text, by, user_id=user_id)


def dead_letters(limit: int = 50, include_revived: bool = False) -> list[DeadLetter]:
    """Operators only: runs dead now, newest first (`include_revived`: every case file ever written). Reads only."""
    return lifecycle.dead_letters_list(limit, include_revived)


def dead_letter(run_id: str) -> DeadLetter:
    """Operators only: a dead letter's case file (InvalidRequest when the run never was dead-lettered). Reads only."""
    return lifecycle.dead_letter(run_id)


def replay_dead_letter(run_id: str, by: str) -> int:
    """Operators only: replay a dead run from its last checkpoint (tasks.control.replay_dead_letter);
    returns the step it resumes. Admitted and paid like a new run; a refusal writes nothing. The worker
    that claims the replay takes a new epoch, so a zombie of the dead run stays fenced out; a crash after
    the commit leaves a queued run the sweeper wakes."""
    return control.replay_dead_letter(run_id, by)


# -- An app's extras: cart cards (or any confirmable offer) --------------------------------------------------


class Card(Protocol):
    """What the front ends show of an app's card: a confirmable offer a run made (a cart card).

    An app's card type may carry more (the CLI's --json prints every field of a dataclass)."""

    @property
    def card_id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def user_id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def items(self) -> list[dict[str, Any]]: ...
    @property
    def total_cents(self) -> int: ...
    @property
    def expires_at_ms(self) -> int: ...


class Order(Protocol):
    """What confirming a card placed; `reused`: this confirm found the first confirm's order."""

    @property
    def order_id(self) -> str: ...
    @property
    def operation_id(self) -> str: ...
    @property
    def card_id(self) -> str: ...
    @property
    def user_id(self) -> str: ...
    @property
    def created_at_ms(self) -> int: ...
    @property
    def reused(self) -> bool: ...


class CardProvider(Protocol):
    """An app's cards, as the service calls them (a module with these three functions will do).

    - `cards_for(run_id)`: the run's committed cards, oldest first ([] when none).
    - `get_card(card_id)`: the card; InvalidRequest when there is none.
    - `confirm_card(card_id, user_id)`: act on the card once as its owner. It must be idempotent (a
      double click or a retry after a crash returns the first order, `reused`) and refuse with
      InvalidRequest, writing nothing, what cannot be confirmed (another user's card, an expired one,
      one whose run ended unfinished)."""

    def cards_for(self, run_id: str) -> Sequence[Card]: ...
    def get_card(self, card_id: str) -> Card: ...
    def confirm_card(self, card_id: str, user_id: str) -> Order: ...


class CardNotFound(InvalidRequest):
    """No card has this id for this caller (another user's card is not found exactly as a missing one),
    or no app in this process offers cards. Nothing was written, so a retry after a crash is safe; a takeover
    of the card's run does not change the card's owner, so the answer stays the same."""


_cards: CardProvider | None = None
_apps_loaded = False
_apps_lock = threading.Lock()


def register_cards(provider: CardProvider | None) -> CardProvider | None:
    """Make `provider` answer `cards_for`, `get_card` and `confirm_card` in this process (None: no app's
    cards); returns the provider it replaces. An app calls it when its module is imported, so a worker, the
    CLI and the API process (which import FENCED_IMPORTS) all see the same cards. Registration is in
    memory only: it writes nothing, so a crash or a takeover has nothing to undo."""
    global _cards
    previous, _cards = _cards, provider
    return previous


def load_apps() -> None:
    """Import the app modules a worker imports (FENCED_IMPORTS), once per process, so their seams register.

    A module that fails to import is logged and skipped: a front end still answers for the runs."""
    global _apps_loaded
    with _apps_lock:
        if _apps_loaded:
            return
        _apps_loaded = True
        for name in (m.strip() for m in get_settings().imports.split(",")):
            if name:
                try:
                    importlib.import_module(name)
                except Exception as exc:  # an app's import error must not take the run views down
                    log.warning("app_import_failed", module=name, error=f"{type(exc).__name__}: {exc}")


def card_provider() -> CardProvider | None:
    """The registered card provider; the first call without one imports FENCED_IMPORTS (load_apps)."""
    if _cards is None:
        load_apps()
    return _cards


def cards_for(run_id: str, user_id: str | None = None) -> list[Card]:
    """The cards the run offered, oldest first ([] when no app offers cards). RunNotFound for another
    user's run. Reads committed rows only: a card a fenced-out holder tried to create never shows, and a
    replay after a crash or a takeover shows its decision's first card, not a second one."""
    _scoped(runs.peek_run(run_id), user_id, run_id)
    return _app_cards(run_id)


def cards_of(view: RunView) -> list[Card]:
    """cards_for a run the caller already read through get_run (scoped there): no second read of its row."""
    return _app_cards(view.run_id)


def _app_cards(run_id: str) -> list[Card]:
    provider = card_provider()
    return list(provider.cards_for(run_id)) if provider is not None else []


def get_card(card_id: str, user_id: str | None = None) -> Card:
    """The card as committed, scoped to the caller: CardNotFound when there is none, it is another user's,
    or no app offers cards here. Reads only: safe after any crash and during a takeover."""
    provider = card_provider()
    if provider is None:
        raise CardNotFound(f"no cart card {card_id!r}: no app in this process offers cards "
                           f"(FENCED_IMPORTS={get_settings().imports!r})")
    try:
        card = provider.get_card(card_id)
    except CardNotFound:
        raise
    except InvalidRequest as exc:
        raise CardNotFound(str(exc)) from None
    if user_id is not None and card.user_id != user_id:
        raise CardNotFound(f"no cart card {card_id!r}")
    return card


def confirm_card(card_id: str, user_id: str) -> Order:
    """Confirm the card as `user_id`, its owner: the app places its order once.

    CardNotFound (nothing written) for a missing card or another user's; InvalidRequest (nothing
    written) for one the app refuses (expired, its run cancelled, failed or dead). A double click, or a
    retry after a crash of the caller or of the app's transaction, returns the first order (`reused`):
    the app keys it by the card, not by the attempt. A takeover of the card's run does not change the card."""
    get_card(card_id, user_id)
    provider = card_provider()
    assert provider is not None  # get_card raised otherwise
    return provider.confirm_card(card_id, user_id)
