"""The dashboard: the static page (plain HTML + JS, no build step), its live operator overview and a run's page data.

- `GET /dashboard` (and `/` redirects there): the page. It asks for an API key, keeps it in localStorage
  and sends it as `Authorization: Bearer` (the WebSocket as `?key=`, as browsers cannot set headers).
- `WS /api/dashboard/live` (admin keys only): a snapshot of workers, runs, the live feed, dead letters
  and counters, then increments only (fenced_api.overview's hub, one per API process).
- `GET /api/dashboard/runs/{run_id}`: a run's page in one answer, scoped to the caller like every run
  route (another user's run is a 404): the row, its checkpoints (run_steps), ledger, live-view events
  and the `fenced explain` answers.
Read-only: nothing here writes a store, so a crash or a takeover of anything changes only what it shows.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import sqlalchemy as sa
import structlog
from fastapi import APIRouter, Depends, HTTPException, WebSocket, WebSocketDisconnect
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, RedirectResponse
from starlette.responses import Response

from checkpoints import codec, history
from checkpoints.db import transaction
from checkpoints.schema import run_steps
from fenced_api.auth import Caller, caller
from fenced_api.live import CLOSE_SILENT, live_settings
from fenced_api.overview import HUB, event_dict
from tasks import explain, service

log = structlog.get_logger("fenced_api.dashboard")
router = APIRouter()
STATIC = Path(__file__).parent / "static"
FILES = {"app.js": "text/javascript", "style.css": "text/css", "index.html": "text/html"}
CLOSE_TOO_SLOW = 4008  # the client fell CLIENT_QUEUE messages behind: reconnect for a fresh snapshot
CLOSE_NOT_ADMIN = 4403


@router.get("/", include_in_schema=False)
def root() -> RedirectResponse:
    """The front door's home is the dashboard."""
    return RedirectResponse("/dashboard")


@router.get("/dashboard", include_in_schema=False)
def page() -> FileResponse:
    """The dashboard page (every view is the same page: `#/` the overview, `#/run/ID` a run)."""
    return FileResponse(STATIC / "index.html", media_type="text/html", headers={"Cache-Control": "no-cache"})


@router.get("/dashboard/{name}", include_in_schema=False)
def static(name: str) -> Response:
    """The page's script and style sheet (a fixed list: no path from the request reaches the disk)."""
    if name not in FILES:
        raise HTTPException(status_code=404, detail=f"no dashboard file {name!r}")
    return FileResponse(STATIC / name, media_type=FILES[name], headers={"Cache-Control": "no-cache"})


def steps_of(run_id: str) -> list[dict[str, Any]]:
    """The run's checkpoints as written, oldest first: which holder (epoch, owner) wrote which phase of
    which step, the usage then, and what the checkpoint held (the decision of a `decided` one)."""
    c = run_steps.c
    with transaction(readonly=True) as conn:
        rows = conn.execute(sa.select(c.step, c.epoch, c.phase, c.owner, c.prompt_tokens, c.completion_tokens,
                                      c.at_ms, c.checkpoint).where(c.run_id == run_id).order_by(c.id)).mappings().all()
    out = []
    for r in rows:
        body = codec.decode(r["checkpoint"])
        decision = body.get("decision") if r["phase"] == "decided" else None
        out.append({"step": r["step"], "epoch": r["epoch"], "phase": r["phase"], "owner": r["owner"],
                    "prompt_tokens": r["prompt_tokens"], "completion_tokens": r["completion_tokens"],
                    "at_ms": r["at_ms"], "history_steps": history.length(body), "decision": decision})
    return out


def run_page(run_id: str, who: Caller) -> dict[str, Any]:
    """Everything the run page shows, as `who` may see it (RunNotFound for another user's run)."""
    user_id = None if who.admin else who.user_id
    run = service.get_run(run_id, user_id)
    page = service.events(run.run_id, user_id)
    try:
        why: dict[str, Any] = explain.explain(run.run_id, user_id).to_dict()
    except Exception as exc:  # the "why" is a reading aid: its failure must not hide the run itself
        log.error("explain_failed", run_id=run.run_id, epoch=run.epoch, error=repr(exc))
        why = {"summary": f"fenced explain failed: {type(exc).__name__}: {exc}", "answers": []}
    return {"run": asdict(run), "steps": steps_of(run.run_id),
            "ledger": [asdict(e) for e in service.ledger_of(run.run_id, user_id)],
            "events": [event_dict(run.run_id, e) for e in page.events], "events_stored": page.stored,
            "explain": why}


@router.get("/api/dashboard/runs/{run_id}", tags=["dashboard"])
async def run_detail(run_id: str, who: Annotated[Caller, Depends(caller)]) -> dict[str, Any]:
    """A run's page: its row, checkpoints, ledger, events (live view) and `fenced explain`; 404 for
    another user's run as for a missing one. Read-only."""
    return await run_in_threadpool(run_page, run_id, who)


@router.websocket("/api/dashboard/live")
async def live(ws: WebSocket, who: Annotated[Caller, Depends(caller)]) -> None:
    """The operator overview: a snapshot, then increments (see fenced_api.overview). Admin keys only
    (close 4403 otherwise); the client pings every 30 s and, like a run's live stream, is closed with
    4408 after live_settings().silent_s (FENCED_LIVE_SILENT_S, 45 s) without a message; a client too
    slow to keep up is closed with 4008 and resynchronises from a new snapshot."""
    await ws.accept()
    if not who.admin:
        await ws.close(code=CLOSE_NOT_ADMIN, reason="the overview needs an admin key")
        return
    silent_s = live_settings().silent_s
    client = await run_in_threadpool(HUB.join, asyncio.get_running_loop())
    sender = asyncio.create_task(_send(ws, client))
    code, reason = 1000, ""
    try:
        while True:
            try:
                message = await asyncio.wait_for(ws.receive_text(), silent_s)
            except TimeoutError:
                code, reason = CLOSE_SILENT, f"silent for {silent_s:g} s"
                break
            if message == '{"type":"ping"}':
                client.put({"type": "pong"})
    except (WebSocketDisconnect, RuntimeError):  # gone, or closed by the sender
        pass
    finally:
        HUB.leave(client)
        sender.cancel()
        with contextlib.suppress(Exception):
            await ws.close(code=code, reason=reason)


async def _send(ws: WebSocket, client: Any) -> None:
    while True:
        message = await client.queue.get()
        if message.get("type") == "dropped":
            await ws.close(code=CLOSE_TOO_SLOW, reason="too slow: reconnect for a fresh snapshot")
            return
        await ws.send_json(message)
