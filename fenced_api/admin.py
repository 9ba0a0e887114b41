"""The operators' API: dead letters (list, case file, replay), for admin keys only (403 for any other key).

403 rather than 404: these routes are listed in /openapi.json for anyone to read, so a 404 would hide
nothing, and a 403 tells a user that the key, not the URL, is wrong. Runs stay scoped to their owner.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel

from fenced_api.auth import Caller, admin_caller
from fenced_api.errors import ApiError, not_found, responses
from fenced_api.models import RUN_ID_PATTERN
from fenced_core.errors import InsufficientCredits, InvalidRequest
from tasks import service

router = APIRouter(prefix="/api/admin", tags=["admin"])
Admin = Annotated[Caller, Depends(admin_caller)]
RunId = Annotated[str, Path(min_length=1, max_length=64, pattern=RUN_ID_PATTERN, description="A dead run's id.")]


class DeadLetterOut(BaseModel):
    """A dead letter's case file: why the run was given up, every attempt with its error, the last
    worker's observations, and its replays."""

    run_id: str
    step: int
    reason: str
    attempts: list[dict[str, Any]]
    observations: dict[str, Any]
    at_ms: int
    replays: int
    replayed_at_ms: int | None
    replayed_by: str | None


class ReplayOut(BaseModel):
    """A replayed dead letter: queued again from its last checkpoint, at `step`."""

    run_id: str
    step: int
    state: str


@router.get("/dead-letters", response_model=list[DeadLetterOut], responses=responses(403))
def dead_letters(_who: Admin, limit: Annotated[int, Query(ge=1, le=500)] = 50,
                 include_revived: bool = False) -> list[DeadLetterOut]:
    """Runs dead now, newest first (`include_revived`: every case file ever written)."""
    return [DeadLetterOut(**vars(d)) for d in service.dead_letters(limit, include_revived)]


@router.get("/dead-letters/{run_id}", response_model=DeadLetterOut, responses=responses(403, 404))
def dead_letter(run_id: RunId, _who: Admin) -> DeadLetterOut:
    """One dead letter's case file; 404 when the run never was dead-lettered."""
    try:
        return DeadLetterOut(**vars(service.dead_letter(run_id)))
    except InvalidRequest:
        raise not_found("dead letter for this run") from None


@router.post("/dead-letters/{run_id}/replay", response_model=ReplayOut, responses=responses(402, 403, 404, 409, 429))
def replay(run_id: RunId, who: Admin) -> ReplayOut:
    """Replay a dead run from its last checkpoint with a fresh delivery budget; admitted and paid like a
    new run (429 with Retry-After, 402), and a refusal writes nothing. 409: the run is not dead (so a
    retry after a lost answer is refused rather than replaying twice; a lost wake-up is the sweeper's)."""
    try:
        step = service.replay_dead_letter(run_id, who.user_id)
    except InsufficientCredits:
        raise  # 402 (it is an InvalidRequest too)
    except InvalidRequest as exc:
        raise ApiError(409, str(exc)) from None
    return ReplayOut(run_id=run_id, step=step, state="queued")
