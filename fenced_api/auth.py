"""Who is calling: an API key in `Authorization: Bearer KEY` (or `?key=KEY` for a browser's WebSocket).

`caller` is the dependency every route uses (HTTP and WebSocket alike); another user's run must then
answer 404, exactly as a missing one. Keys are issued by `fenced users add NAME [--admin]`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, WebSocketException, status
from starlette.requests import HTTPConnection

from checkpoints import api_keys


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: the user the key was issued to, and whether it may act as an operator."""

    user_id: str
    admin: bool = False


def key_of(conn: HTTPConnection) -> str | None:
    """The key the request carries: the Authorization header's Bearer token, else the `key` query parameter."""
    header = conn.headers.get("authorization")
    if header:
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None
    return conn.query_params.get("key")


def caller(conn: HTTPConnection) -> Caller:
    """The caller of this request or WebSocket; 401 (WebSocket: close code 1008) without a valid key.

    Stateless: every request looks its key up in the run store (one indexed read), so any replica
    answers alike and a revoked key stops working at once. A store that cannot be reached answers 503
    (the app's StoreUnavailable handler), never a silent 401."""
    key = key_of(conn)
    owner = api_keys.lookup(key) if key else None
    if owner is None:
        reason = "a valid API key is required (Authorization: Bearer KEY)" if key is None else "invalid API key"
        if conn.scope["type"] == "websocket":
            raise WebSocketException(code=status.WS_1008_POLICY_VIOLATION, reason=reason)
        raise HTTPException(status_code=401, detail=reason, headers={"WWW-Authenticate": "Bearer"})
    return Caller(owner.user_id, owner.admin)


def admin_caller(who: Annotated[Caller, Depends(caller)]) -> Caller:
    """`who` if it is an admin; else 403 (the admin routes exist for everyone to see in /openapi.json,
    so hiding them behind a 404 would hide nothing; a 403 tells a user their key lacks the right)."""
    if not who.admin:
        raise HTTPException(status_code=403, detail="this needs an admin key (fenced users add NAME --admin)")
    return who
