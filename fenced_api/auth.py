"""Who is calling: an API key in `Authorization: Bearer KEY` (or `?key=KEY` for a browser's WebSocket).

`caller` is the dependency every route uses; another user's run must answer 404, exactly as a missing one.
(The key store is being written: this placeholder accepts nothing.)"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import HTTPException, Request


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: the user the key was issued to, and whether it may act as an operator."""

    user_id: str
    admin: bool = False


async def caller(request: Request) -> Caller:
    raise HTTPException(status_code=401, detail="no API key store yet")
