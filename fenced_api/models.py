"""The JSON shapes the API answers with (pydantic models, so /openapi.json documents them) and text checks."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from tasks.service import Card, RunSummary, RunView

# Run and card ids are uuids and `card_<hex>`: visible ASCII, no slash. Anything else cannot name one.
RUN_ID_PATTERN = r"^[!-.0-~]+$"


def check_text(value: str, field: str | None = None) -> str:
    """`value` if it is text the stores can keep: no NUL, no lone surrogate (JSON allows "\\ud800", UTF-8 does
    not). Raises ValueError (a 422 naming the field, through pydantic) otherwise."""
    bad = next((c for c in value if c == "\x00" or "\ud800" <= c <= "\udfff"), None)
    if bad is not None:
        where = f"{field}: " if field else ""
        raise ValueError(f"{where}contains {bad!r}, which is not allowed (NUL or a lone surrogate)")
    return value


class Usage(BaseModel):
    """What the run used so far."""

    prompt_tokens: int
    completion_tokens: int
    model_calls: int


class Charge(BaseModel):
    """The run's billing hold and what it charged: `charged_credits` is None until something is settled."""

    state: str = Field(description="held (open), settled or released")
    held_credits: int
    charged_credits: int | None


class Question(BaseModel):
    """What a waiting run asked; answer it with POST /api/runs/{id}/reply."""

    text: str
    kind: str = Field(description="ask_user (the agent asked) or fixable (a tool needs a fix)")
    asked_at_ms: int


class CardOut(BaseModel):
    """A cart confirmation card the run offered (an app's, through tasks.service's card seam: the shopping
    example's); confirm it with POST /api/cards/{id}/confirm."""

    card_id: str
    state: str = Field(description="offered or confirmed")
    items: list[dict[str, Any]]
    total_cents: int
    expires_at_ms: int

    @classmethod
    def of(cls, card: Card) -> CardOut:
        return cls(card_id=card.card_id, state=card.state, items=card.items, total_cents=card.total_cents,
                   expires_at_ms=card.expires_at_ms)


class RunSummaryOut(BaseModel):
    """A run as listed: its row without the charge, cards or question."""

    run_id: str
    agent: str
    kind: str
    input: str
    state: str
    step: int
    epoch: int
    answer: str | None
    error_class: str | None
    error: str | None
    usage: Usage
    created_at_ms: int
    updated_at_ms: int
    finished_at_ms: int | None


class RunOut(RunSummaryOut):
    """One run in full: the row, its charge, the cards it offered, and the question it waits on."""

    agent_version: str
    phase: str
    charge: Charge | None
    cards: list[CardOut]
    question: Question | None


def _summary_fields(run: RunSummary) -> dict[str, Any]:
    return {"run_id": run.run_id, "agent": run.agent, "kind": run.kind, "input": run.query, "state": run.state,
            "step": run.step, "epoch": run.epoch, "answer": run.answer, "error_class": run.error_class,
            "error": run.error, "usage": Usage(prompt_tokens=run.prompt_tokens, completion_tokens=run.completion_tokens,
                                               model_calls=run.model_calls),
            "created_at_ms": run.created_at_ms, "updated_at_ms": run.updated_at_ms,
            "finished_at_ms": run.finished_at_ms}


def summary_out(run: RunSummary) -> RunSummaryOut:
    """A listed run's JSON."""
    return RunSummaryOut(**_summary_fields(run))


def charge_of(holds: list[dict[str, Any]]) -> Charge | None:
    """The charge of a run's hold (a replayed dead letter's earlier closings included)."""
    if not holds:
        return None
    h = holds[-1]
    before = int(h.get("credits_charged_before") or 0)
    charged = h.get("credits_charged")
    total = None if charged is None and not before else before + int(charged or 0)
    return Charge(state=str(h["state"]), held_credits=int(h["credits_held"]), charged_credits=total)


def run_out(view: RunView, cards: list[Card]) -> RunOut:
    """One run's JSON: the service's view plus the cards an app offered for it (service.cards_of)."""
    q = view.question
    question = None if q is None else Question(text=q.question, kind=q.kind, asked_at_ms=q.asked_at_ms)
    return RunOut(**_summary_fields(view), agent_version=view.agent_version, phase=view.phase,
                  charge=charge_of(view.holds), cards=[CardOut.of(c) for c in cards], question=question)
