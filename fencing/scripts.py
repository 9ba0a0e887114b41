"""Loads the .lua files beside this module once and registers them on a client."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

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
        """Run one script now (EVALSHA, loading it on NOSCRIPT): one round trip."""
        return self._scripts[name](keys=keys, args=args, client=client)

    def queue(self, pipe: Pipeline, name: str, keys: list[str], args: list[Any]) -> None:
        """Queue a script on a pipeline run by `execute` (EVALSHA, no per-execute SCRIPT EXISTS)."""
        pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)

    def execute(self, client: redis.Redis, build: Callable[[Pipeline], None]) -> list[Any]:
        """Run what `build(pipe)` queues in ONE round trip and return the replies.

        redis-py checks every script of a pipeline with SCRIPT EXISTS before each execute, a second
        round trip per pipeline; here scripts go as plain EVALSHA. If the server lost its script cache
        (a restart or SCRIPT FLUSH), every EVALSHA fails with NOSCRIPT and changes nothing: the scripts
        are loaded and the pipeline is built and sent once more. Callers queue only commands that are
        harmless to repeat (absolute SET/ZADD/ZREM), so the non-script commands running twice is fine.
        """
        for attempt in (1, 2):
            pipe = client.pipeline(transaction=False)
            build(pipe)
            try:
                return pipe.execute()
            except NoScriptError:
                if attempt == 2:
                    raise
                for script in self._scripts.values():
                    script.sha = client.script_load(script.script)
        raise AssertionError("unreachable")


_registered: dict[int, Scripts] = {}


def scripts_for(client: redis.Redis) -> Scripts:
    """The Scripts registered on this client (cached per client object)."""
    found = _registered.get(id(client))
    if found is None:
        found = _registered[id(client)] = Scripts(client)
    return found
