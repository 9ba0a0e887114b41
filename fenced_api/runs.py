"""The runs API: submit, read, list, cancel and reply to the caller's runs, and confirm their cart cards.

Thin: each route validates its input (pydantic, 422 naming the field), calls tasks.service (or
tasks.submit) scoped to the caller, and shapes the answer; an app's cards come through the service's card
seam, never from the app itself. Another
user's run or card is a 404, exactly as a missing one. Nothing here keeps state between requests.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from checkpoints import runs as run_rows
from fenced_api.auth import Caller, caller
from fenced_api.errors import ApiError, bad_field, not_found, responses
from fenced_api.models import RUN_ID_PATTERN, RunOut, RunSummaryOut, check_text, run_out, summary_out
from fenced_core.errors import IdempotencyConflict, InvalidRequest
from fenced_core.settings import get_settings
from tasks import programs, service
from tasks.submit import run_id_for_key, submit_run

router = APIRouter(prefix="/api", tags=["runs"])
Who = Annotated[Caller, Depends(caller)]
RunId = Annotated[str, Path(min_length=1, max_length=64, pattern=RUN_ID_PATTERN, description="A run id.")]
CardId = Annotated[str, Path(min_length=1, max_length=64, pattern=RUN_ID_PATTERN, description="A card id (card_...).")]
RunState = Literal["queued", "running", "waiting", "done", "failed", "cancelled", "dead"]


class SubmitBody(BaseModel):
    """A new run: what the user asked, and which agent answers it."""

    model_config = ConfigDict(extra="forbid")

    input: str = Field(description="What the user asked (the run's query); 1 to FENCED_MAX_QUERY_CHARS characters.")
    agent: str | None = Field(None, min_length=1, max_length=128,
                              description="A registered agent or task (default FENCED_DEFAULT_AGENT).")
    kind: Literal["normal", "large"] = Field("normal", description="normal, or large (bigger hold, own queue).")
    idempotency_key: str | None = Field(None, min_length=1, max_length=200,
                                        description="A retried POST with the same key returns the same run.")

    @field_validator("input")
    @classmethod
    def _input(cls, value: str) -> str:
        check_text(value)
        if not value.strip():
            raise ValueError("must not be empty")
        limit = get_settings().max_query_chars
        if len(value) > limit:
            raise ValueError(f"is {len(value)} characters; the limit is {limit}")
        return value

    @field_validator("agent", "idempotency_key")
    @classmethod
    def _plain(cls, value: str | None) -> str | None:
        return None if value is None else check_text(value)


class ReplyBody(BaseModel):
    """The answer to the question a waiting run asked."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="The answer; 1 to FENCED_MAX_QUERY_CHARS characters, not only spaces.")

    @field_validator("text")
    @classmethod
    def _text(cls, value: str) -> str:
        check_text(value)
        if not value.strip():
            raise ValueError("must not be empty")
        if len(value) > get_settings().max_query_chars:
            raise ValueError(f"is {len(value)} characters; the limit is {get_settings().max_query_chars}")
        return value


class RunPageOut(BaseModel):
    """A page of the caller's runs, newest first; pass `next_cursor` as `cursor` for the next page."""

    runs: list[RunSummaryOut]
    next_cursor: str | None


class CancelOut(BaseModel):
    """What a cancel did: `noop` when the run had ended already (`previous_state` says how)."""

    run_id: str
    state: str
    previous_state: str
    noop: bool
    credits_charged: int | None


class ReplyOut(BaseModel):
    """The question answered; the run is queued again and woken."""

    run_id: str
    question: str
    reply: str
    state: str


class OrderOut(BaseModel):
    """The order a confirmed card placed; `reused`: this confirm found the first one's order."""

    order_id: str
    card_id: str
    operation_id: str
    created_at_ms: int
    reused: bool


def _view(run_id: str, who: Caller) -> RunOut:
    view = service.get_run(run_id, who.user_id)
    return run_out(view, service.cards_of(view))


@router.post("/runs", status_code=201, response_model=RunOut,
             responses={200: {"model": RunOut, "description": "The run an earlier POST with this idempotency key "
                                                                "created (nothing new was created)"},
                        **responses(400, 402, 409, 429)})
def submit(body: SubmitBody, who: Who, response: Response,
           idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None) -> RunOut:
    """Submit a run for the caller: 201 with the new run, or 200 with the run an earlier POST with the same
    idempotency key (body field or `Idempotency-Key` header) created. 402: not enough credits; 429: too
    many runs (Retry-After); a refused request creates nothing.

    Under a crash of this replica: the run row and its hold commit together or not at all (a lost
    wake-up is sent by the sweeper); a client that lost the answer retries with the same key on any
    replica and gets the same run. A takeover of the run by another worker does not concern the submit."""
    key = body.idempotency_key
    if idempotency_key is not None:
        try:
            check_text(idempotency_key)
        except ValueError as exc:
            raise bad_field("header.idempotency-key", str(exc)) from None
        if key is not None and key != idempotency_key:
            raise bad_field("idempotency_key", "differs from the Idempotency-Key header; send one of them")
        key = idempotency_key
    agent = body.agent or get_settings().default_agent
    program = programs.lookup(agent)
    if program is None:
        raise bad_field("agent", f"no agent or task named {agent!r} is registered here "
                                 f"(registered: {', '.join(programs.names()) or 'none'})")
    existed = key is not None and run_rows.peek_run(run_id_for_key(who.user_id, key)) is not None
    try:
        run_id = submit_run(who.user_id, body.input, body.kind, key, agent=agent, agent_version=program.version)
    except IdempotencyConflict as exc:
        raise ApiError(409, str(exc)) from None
    if existed:
        response.status_code = 200
    return _view(run_id, who)


@router.get("/runs", response_model=RunPageOut, responses=responses())
def list_runs(who: Who, state: RunState | None = None,
              limit: Annotated[int, Query(ge=1, le=100)] = 20,
              cursor: Annotated[str | None, Query(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_=-]+$")] = None,
              ) -> RunPageOut:
    """The caller's runs, newest first, optionally in one state; pages of `limit` (next: `cursor`)."""
    try:
        page = service.list_runs(who.user_id, state=state, limit=limit, cursor=cursor)
    except InvalidRequest as exc:
        if cursor is not None and "cursor" in str(exc):
            raise bad_field("query.cursor", "is not a next_cursor this API returned") from None
        raise
    return RunPageOut(runs=[summary_out(r) for r in page.runs], next_cursor=page.next_cursor)


@router.get("/runs/{run_id}", response_model=RunOut, responses=responses(404))
def get_run(run_id: RunId, who: Who) -> RunOut:
    """One of the caller's runs: state, step, epoch, answer, usage, charge, cards, and the question when waiting.
    An operator (admin key) may read any run, as on its live stream and dashboard page; acting on a run
    (cancel, reply, confirm) stays its owner's."""
    view = service.get_run(run_id, None if who.admin else who.user_id)
    return run_out(view, service.cards_of(view))


@router.post("/runs/{run_id}/cancel", response_model=CancelOut, responses=responses(404))
def cancel(run_id: RunId, who: Who) -> CancelOut:
    """Cancel the run: it ends `cancelled`, what was used is settled, and the worker holding it (or one
    taking it over) is fenced out of every later write. A run that ended already: `noop`, so a retry
    after a lost answer or a replica crash is safe."""
    done = service.cancel(run_id, who.user_id, user_id=who.user_id)
    state = "cancelled" if not done.noop else done.previous_state
    return CancelOut(run_id=run_id, state=state, previous_state=done.previous_state, noop=done.noop,
                     credits_charged=done.credits_charged)


@router.post("/runs/{run_id}/reply", response_model=ReplyOut, responses=responses(404, 409))
def reply(run_id: RunId, body: ReplyBody, who: Who) -> ReplyOut:
    """Answer the question the waiting run asked; it is queued and woken. 409 when it is not waiting.

    The reply and the run's return to `queued` commit together; a lost wake-up is sent by the sweeper.
    A retry after a lost answer gets 409 (the question is answered already): GET the run to see it."""
    try:
        answered = service.reply(run_id, body.text, who.user_id, user_id=who.user_id)
    except InvalidRequest as exc:
        raise ApiError(409, str(exc)) from None
    return ReplyOut(run_id=run_id, question=answered.question, reply=body.text, state="queued")


@router.post("/cards/{card_id}/confirm", response_model=OrderOut, tags=["cards"], responses=responses(404, 409))
def confirm(card_id: CardId, who: Who) -> OrderOut:
    """Confirm one of the caller's cart cards: places one order; a second confirm (a double click) returns
    the same order number. 409: the card expired, or its run was cancelled, failed or dead-lettered.

    The order, the card's state and the ledger entry commit together, keyed by the card's operation id:
    a retry after a crash, on any replica, returns the first order; a takeover of the run does not
    change the card."""
    try:
        order = service.confirm_card(card_id, who.user_id)
    except service.CardNotFound:
        raise not_found("cart card with this id") from None
    except InvalidRequest as exc:
        raise ApiError(409, str(exc)) from None
    return OrderOut(order_id=order.order_id, card_id=order.card_id, operation_id=order.operation_id,
                    created_at_ms=order.created_at_ms, reused=order.reused)
