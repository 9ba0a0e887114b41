"""A run's live events: `GET /api/runs/{id}/events` as a WebSocket (SSE at `/events/sse`), snapshot then increments.

Stateless: a connection opens with the run's merged view (or, given the last id it saw, with every
event since), then the process's hub hands it each new event once. Nothing is kept between
connections, so a client reconnects to any replica and resumes exactly. The protocol (messages, close
codes, keepalive) is in docs/live-events.md.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, WebSocket
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect

from fenced_api.auth import Caller, caller
from fenced_api.live_hub import Fold, Outbox, Subscriber, event_json, hub, items_of
from fenced_api.models import RUN_ID_PATTERN
from fenced_core.errors import InvalidRequest, RunNotFound, StoreUnavailable
from fencing import events as ev
from tasks import service

router = APIRouter(prefix="/api", tags=["live"])
Who = Annotated[Caller, Depends(caller)]
RunId = Annotated[str, Path(min_length=1, max_length=64, pattern=RUN_ID_PATTERN, description="A run id.")]
After = Query(None, description="The last stream id you were sent (e.g. 1700000000000-0): resume after it.")

# Close codes (docs/live-events.md). 1000: the run ended (its final event was sent).
CLOSE_ENDED = 1000
CLOSE_SILENT = 4408  # no message from the client for silent_s
CLOSE_SLOW = 4429  # the client did not keep up: its send queue passed queue_bytes
STREAM_ID = re.compile(r"\d{1,20}(-\d{1,20})?")


class LiveSettings(BaseSettings):
    """The live stream's knobs, from FENCED_LIVE_* (defaults as in the panel this replaces)."""

    model_config = SettingsConfigDict(env_prefix="FENCED_LIVE_", extra="ignore")

    ping_s: float = Field(30, gt=0, description="How often a client pings; SSE: a comment this often")
    silent_s: float = Field(45, gt=0, description="A WebSocket client that sends nothing this long is dropped")
    queue_bytes: int = Field(1 << 20, gt=0, description="Per-connection send queue bound; past it: dropped (4429)")
    block_ms: int = Field(5_000, gt=0, description="Longest single Redis wait of the hub")
    close_wait_s: float = Field(10, gt=0, description="How long a close waits for a slow client to take it")


@functools.cache
def live_settings() -> LiveSettings:
    """The process's live settings (read once)."""
    return LiveSettings()


@dataclass
class Start:
    """What a connection sends first, and where it goes on from."""

    messages: list[dict[str, Any]]
    fold: Fold
    ended: bool = False
    run: dict[str, Any] = field(default_factory=dict)


def check_after(after: str | None) -> str | None:
    """`after` validated (a stream id like 1700000000000-0), or None; InvalidRequest naming the field."""
    if after in (None, ""):
        return None
    if not STREAM_ID.fullmatch(after):
        raise InvalidRequest(f"after: must be a stream id like 1700000000000-0, not {after[:80]!r}")
    return after


def start(run_id: str, who: Caller, after: str | None) -> Start:
    """The opening of a stream (blocking: the run row and the stream). With no `after`, a snapshot: the
    run and its merged view. With `after` (the last id the client was sent), a `reconnected` message
    and every event since, folded exactly as the first connection would have sent them; an `after`
    the stream no longer holds (trimmed, or Redis lost it) gets a fresh snapshot with `reset`.
    RunNotFound for a missing run or another user's (an admin may watch any)."""
    view = service.get_run(run_id, None if who.admin else who.user_id)
    run = json.loads(json.dumps(view.to_dict(), default=str))
    stream = ev.read(run_id)
    fold = Fold()
    known = after is not None and (ev.id_key(after) == (0, 0) or any(e.stream_id == after for e in stream))
    messages: list[dict[str, Any]] = []
    if known:
        messages.append({"type": "reconnected", "after": after, "run": run})
    for item in items_of(stream):
        msg = fold.step(item)
        if known and msg is not None and ev.id_key(item.event.stream_id) > ev.id_key(after or "0"):
            messages.append(msg)
    if not known:
        messages.append({"type": "snapshot", "run": run, "events": [event_json(e) for e in fold.view(stream)],
                         "last_id": fold.last, **({"reset": True} if after is not None else {})})
    return Start(messages, fold, ended=view.ended and fold.final_seen, run=run)


@router.websocket("/runs/{run_id}/events")
async def events_ws(websocket: WebSocket, run_id: str, who: Who, after: str | None = After) -> None:
    """The live stream over a WebSocket. Refusals are HTTP answers to the handshake (404 another user's
    or a missing run, 400 a bad `after`, 503 a store down). Ends with close 1000 after the final event,
    4408 for a silent client, 4429 for one that does not keep up. Reads only: a worker's crash shows as
    the new holder's task_resumed (the lost half-step marked); this process dying loses only its
    connections, whose clients resume with their last id on any replica."""
    s = live_settings()
    try:
        opening = await run_in_threadpool(start, run_id, who, check_after(after))
    except (RunNotFound, InvalidRequest, StoreUnavailable) as exc:
        status = 404 if isinstance(exc, RunNotFound) else 400 if isinstance(exc, InvalidRequest) else 503
        detail = f"no run with id {run_id!r}" if status == 404 else str(exc)
        await websocket.send_denial_response(JSONResponse({"detail": detail}, status_code=status))
        return
    await websocket.accept()
    outbox = Outbox(s.queue_bytes)
    for msg in opening.messages:  # bounded by the stream itself (FENCED_EVENTS_KEEP), not by the queue
        outbox.put(json.dumps(msg, default=str), force=True)
    sub = Subscriber(run_id, opening.fold, outbox)
    if opening.ended:
        sub.end()
    else:
        hub(s.block_ms).subscribe(sub)
    try:
        code, reason = await _serve(websocket, sub, s)
    finally:
        hub(s.block_ms).unsubscribe(sub)
    if code is not None:
        try:
            await asyncio.wait_for(websocket.close(code, reason), s.close_wait_s)
        except (TimeoutError, RuntimeError, WebSocketDisconnect):
            pass  # the client is gone or never took the close frame: the transport is closed anyway


async def _serve(websocket: WebSocket, sub: Subscriber, s: LiveSettings) -> tuple[int | None, str]:
    """Send, listen and watch until one of them ends the connection; the close code and reason."""

    async def send() -> tuple[int | None, str]:
        outbox = sub.outbox
        while True:
            while outbox.queue:
                await websocket.send_text(outbox.pop())
            if outbox.overflowed:
                return CLOSE_SLOW, "too slow: send queue full"
            if sub.ended.is_set():
                return CLOSE_ENDED, "run ended"
            outbox.ready.clear()
            await outbox.ready.wait()

    async def listen() -> tuple[int | None, str]:
        while True:
            try:
                message = await asyncio.wait_for(websocket.receive(), s.silent_s)
            except TimeoutError:
                return CLOSE_SILENT, f"silent for {s.silent_s:g} s"
            if message["type"] == "websocket.disconnect":
                return None, "gone"
            text = message.get("text") or ""
            if '"ping"' in text:
                sub.outbox.put('{"type":"pong"}')

    async def watch_overflow() -> tuple[int | None, str]:
        await sub.outbox.dropped.wait()  # the sender may be stuck in a send the client never reads
        return CLOSE_SLOW, "too slow: send queue full"

    tasks = [asyncio.ensure_future(f()) for f in (send, listen, watch_overflow)]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        first = next(t for t in tasks if t in done)
        try:
            return first.result()
        except (WebSocketDisconnect, RuntimeError, OSError):
            return None, "gone"
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _sse(msg: dict[str, Any]) -> str:
    sid = msg.get("id") or msg.get("last_id") or (msg.get("event") or {}).get("id")
    head = f"id: {sid}\n" if sid else ""
    return f"{head}event: {msg['type']}\ndata: {json.dumps(msg, default=str)}\n\n"


@router.get("/runs/{run_id}/events/sse", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}, "description": "Server-sent events"}})
async def events_sse(run_id: RunId, who: Who, after: str | None = After,
                     last_event_id: Annotated[str | None, Header()] = None) -> StreamingResponse:
    """The same stream as server-sent events (for clients without WebSockets): each message is an
    `event:` of its type with its stream `id:`, so EventSource reconnects with Last-Event-ID and
    resumes; a comment every ping_s keeps proxies open; a slow client gets `event: dropped` and ends."""
    s = live_settings()
    opening = await run_in_threadpool(start, run_id, who, check_after(after or last_event_id))
    return StreamingResponse(_sse_stream(run_id, opening, s), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _sse_stream(run_id: str, opening: Start, s: LiveSettings) -> AsyncIterator[str]:
    for msg in opening.messages:
        yield _sse(msg)
    if opening.ended:
        return
    outbox = Outbox(s.queue_bytes)
    sub = Subscriber(run_id, opening.fold, outbox, frame=_sse)
    hub(s.block_ms).subscribe(sub)
    try:
        while True:
            if sub.ended.is_set() and not outbox.queue:
                return
            try:
                text = await asyncio.wait_for(outbox.get(), s.ping_s)
            except TimeoutError:
                yield ": ping\n\n"
                continue
            if text is None:
                yield _sse({"type": "dropped", "code": CLOSE_SLOW, "reason": "too slow: send queue full"})
                return
            yield text
    finally:
        hub(s.block_ms).unsubscribe(sub)
