"""The API's error answers: one JSON shape, and fenced's exceptions mapped to status codes in one place.

Every error body is `{"detail": "...", "code": "...", "errors": [{"field": ..., "message": ...}]}`
(`errors` only for bad input). What each code means, and that a refused request wrote nothing, is in
docs/api.md.
"""

from __future__ import annotations

import math
from typing import Any, cast

import redis
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from fenced_core.errors import AdmissionRefused, InsufficientCredits, InvalidRequest, RunNotFound, StoreUnavailable

log = structlog.get_logger("fenced_api")

CODES = {400: "bad_request", 401: "unauthorized", 402: "insufficient_credits", 403: "forbidden",
         404: "not_found", 405: "method_not_allowed", 409: "conflict", 422: "invalid_input",
         429: "too_many_runs", 500: "internal", 503: "unavailable"}
STORE_RETRY_AFTER_S = 5


class FieldError(BaseModel):
    """One bad field of a request: where it is (`body.input`, `query.limit`, `header.idempotency-key`) and why."""

    field: str
    message: str


class ErrorBody(BaseModel):
    """Every error answer: a message for people, a stable code for programs, and the bad fields."""

    detail: str
    code: str
    errors: list[FieldError] | None = None


class ApiError(Exception):
    """An error answer raised by a route: `status`, a message, and optionally the fields at fault."""

    def __init__(self, status: int, detail: str, *, fields: list[FieldError] | None = None,
                 headers: dict[str, str] | None = None, code: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.fields, self.headers = status, detail, fields, headers
        self.code = code or CODES.get(status, "error")


def bad_field(field: str, message: str, status: int = 422) -> ApiError:
    """A 422 (bad input, nothing written) naming `field`."""
    return ApiError(status, f"{field}: {message}", fields=[FieldError(field=field, message=message)])


def not_found(what: str) -> ApiError:
    """404: no such thing, or another user's (the two are the same answer, so ids cannot be probed)."""
    return ApiError(404, f"no {what}")


def _json(err: ApiError) -> JSONResponse:
    body = ErrorBody(detail=err.detail, code=err.code, errors=err.fields)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=err.status, headers=err.headers)


def retry_after(seconds: float) -> str:
    """A Retry-After value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds))) if math.isfinite(seconds) else "60"


def _field_name(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] == "body" and len(parts) > 1:
        parts = parts[1:]  # "input", not "body.input": the name a client wrote
    return ".".join(parts) or "body"


def _validation(exc: RequestValidationError) -> ApiError:
    fields = []
    for e in exc.errors():
        msg = str(e.get("msg", "invalid"))
        fields.append(FieldError(field=_field_name(e.get("loc", ())), message=msg.removeprefix("Value error, ")))
    detail = "; ".join(f"{f.field}: {f.message}" for f in fields) or "invalid request"
    return ApiError(422, detail, fields=fields)


def error_of(exc: BaseException) -> ApiError | None:
    """The answer for one of fenced's exceptions raised by a call a route made, or None (a bug: 500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RunNotFound):
        return not_found("run with this id")
    if isinstance(exc, InsufficientCredits):
        return ApiError(402, str(exc))
    if isinstance(exc, AdmissionRefused):
        # "unavailable": admission could not be checked (Redis): the service, not the caller, is at fault.
        status = 503 if exc.limit == "unavailable" else 429
        return ApiError(status, str(exc), headers={"Retry-After": retry_after(exc.retry_after_s)},
                        code=None if status == 503 else f"too_many_runs_{exc.limit}")
    if isinstance(exc, InvalidRequest):
        return ApiError(400, str(exc))
    if isinstance(exc, (StoreUnavailable, redis.RedisError)):
        return ApiError(503, "a store is unreachable; retry later",
                        headers={"Retry-After": str(STORE_RETRY_AFTER_S)})
    return None


def install(app: FastAPI) -> None:
    """Register the handlers on `app`: fenced's exceptions, bad input (422 naming the field), HTTP errors."""

    async def on_api_error(_request: Request, exc: Exception) -> JSONResponse:
        err = error_of(exc)
        if err is None:
            log.error("api_unhandled", error=repr(exc)[:500], exc_info=exc)
            err = ApiError(500, "internal error; the request may or may not have taken effect")
        elif err.status >= 500:
            log.warning("api_unavailable", error=repr(exc)[:500])
        return _json(err)

    async def on_validation(_request: Request, exc: Exception) -> JSONResponse:
        return _json(_validation(cast(RequestValidationError, exc)))

    async def on_http(_request: Request, exc: Exception) -> JSONResponse:
        exc = cast(StarletteHTTPException, exc)
        err = ApiError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {}))
        return _json(err)

    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    for exc_type in (ApiError, RunNotFound, InvalidRequest, AdmissionRefused, StoreUnavailable, redis.RedisError,
                     Exception):
        app.add_exception_handler(exc_type, on_api_error)


RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No valid API key"},
    422: {"model": ErrorBody, "description": "Bad input; `errors` names each field; nothing was written"},
    503: {"model": ErrorBody, "description": "A store is unreachable; retry after Retry-After seconds"},
}
"""Error answers every authenticated route may give (for the OpenAPI document)."""


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """RESPONSES plus the given statuses, each documented with the ErrorBody shape."""
    extra: dict[int | str, dict[str, Any]] = {
        s: {"model": ErrorBody, "description": CODES.get(s, "error").replace("_", " ")} for s in statuses}
    return {**RESPONSES, **extra}
