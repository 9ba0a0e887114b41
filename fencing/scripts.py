"""Loads the .lua files beside this module once and registers them on a client."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import redis
from redis.commands.core import Script

_LUA_DIR = Path(__file__).with_name("lua")


@functools.cache
def source(name: str) -> str:
    return (_LUA_DIR / f"{name}.lua").read_text()


class Scripts:
    """The scripts, registered on one client; calling one uses EVALSHA and falls back to EVAL."""

    NAMES = (
        "acquire",
        "renew",
        "release",
        "raise_epoch",
        "append_event",
        "rescue",
        "pop_expired",
        "fault_hit",
        "release_prefix",
        "admit",
        "promote",
    )

    def __init__(self, client: redis.Redis) -> None:
        self._scripts: dict[str, Script] = {n: client.register_script(source(n)) for n in self.NAMES}

    def __call__(self, name: str, keys: list[str], args: list[Any], client: Any = None) -> Any:
        return self._scripts[name](keys=keys, args=args, client=client)


_registered: dict[int, Scripts] = {}


def scripts_for(client: redis.Redis) -> Scripts:
    """The Scripts registered on this client (cached per client object)."""
    found = _registered.get(id(client))
    if found is None:
        found = _registered[id(client)] = Scripts(client)
    return found
