"""The Lua scripts: loaded once from the .lua files beside this module, registered per client, and one
typed wrapper per script that names its keys and arguments once (the order of the script's header).

Call sites build a `Call` with a wrapper (`scripts.renew(run_id, token=..., ttl_ms=...)`) and run it
now (`scripts_for(client)(call)`) or queue it on a pipeline (`Scripts.queue`); no call site writes
positional KEYS/ARGV. Driver errors leave as fencing.connection.RedisUnavailable (the client's own
translation)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import redis
from redis.client import Pipeline
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from fencing import keys as k
from fencing import round_trip
from fencing.cluster import is_cluster

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
        "release_slot",
        "promote",
    )

    def __init__(self, client: redis.Redis) -> None:
        self._scripts: dict[str, Script] = {n: client.register_script(source(n)) for n in self.NAMES}

    def __call__(self, call: Call | str, keys: Sequence[str] = (), args: Sequence[Any] = (),
                 client: Any = None) -> Any:
        """Run one script now (EVALSHA, loading it on NOSCRIPT): one round trip. `call` comes from a
        typed wrapper below; a bare script name with raw keys and args is for the Lua tests only."""
        if isinstance(call, str):
            call = Call(call, tuple(keys), tuple(args))
        return self._scripts[call.script](keys=list(call.keys), args=list(call.args), client=client)

    def queue(self, pipe: Pipeline, call: Call | Command) -> None:
        """Queue a script (or a plain `Command`) on a pipeline run by `execute` (EVALSHA, no per-execute SCRIPT
        EXISTS). Queued as a
        raw command: a Redis Cluster pipeline refuses its `evalsha` method, yet routes an EVALSHA by its
        keys (all in one slot: see fencing.keys): named explicitly, since a cluster pipeline cannot read an
        EVALSHA's keys itself and would send it to any node, then resend it alone after the MOVED reply (one
        round trip per script instead of one per node)."""
        options: dict[str, Any] = {}
        if call.keys and is_cluster(pipe):
            options["target_nodes"] = cast(RedisCluster, pipe).get_node_from_key(call.keys[0])
        if isinstance(call, Command):
            pipe.execute_command(call.name, *call.keys, *call.args, **options)
            return
        pipe.execute_command("EVALSHA", self._scripts[call.script].sha, len(call.keys), *call.keys, *call.args,
                             **options)

    def execute(self, client: redis.Redis, build: Callable[[Pipeline], None],
                raise_on_error: bool = True) -> list[Any]:
        """Run what `build(pipe)` queues in ONE round trip and return the replies.

        redis-py checks every script of a pipeline with SCRIPT EXISTS before each execute, a second
        round trip per pipeline; here scripts go as plain EVALSHA. If the server lost its script cache
        (a restart or SCRIPT FLUSH), every EVALSHA fails with NOSCRIPT and changes nothing: the scripts
        are loaded and the pipeline is built and sent once more. Callers queue only commands that are
        harmless to repeat (absolute SET/ZADD/ZREM), so the non-script commands running twice is fine.
        With `raise_on_error` False, a command's error is its reply (the others' replies stand).
        """
        for attempt in (1, 2):
            pipe = client.pipeline(transaction=False)
            build(pipe)
            try:
                if is_cluster(pipe):  # routed per node by the cluster pipeline
                    replies = pipe.execute(raise_on_error=raise_on_error)
                else:
                    replies = round_trip.exchange(client, pipe.command_stack, raise_on_error)
            except NoScriptError:
                if attempt == 2:
                    raise
            else:
                if attempt == 2 or not any(isinstance(reply, NoScriptError) for reply in replies):
                    return replies
            for script in self._scripts.values():
                script.sha = client.script_load(script.script)
        raise AssertionError("unreachable")

    def execute_all(self, client: redis.Redis, calls: Sequence[Call | Command],
                    raise_on_error: bool = True) -> list[Any]:
        """Run `calls` in ONE round trip (as `execute`); their replies in order."""

        def build(pipe: Pipeline) -> None:
            for call in calls:
                self.queue(pipe, call)

        return self.execute(client, build, raise_on_error) if calls else []


_registered: dict[int, Scripts] = {}


def scripts_for(client: redis.Redis) -> Scripts:
    """The Scripts registered on this client (cached per client object)."""
    found = _registered.get(id(client))
    if found is None:
        found = _registered[id(client)] = Scripts(client)
    return found


@dataclass(frozen=True)
class Call:
    """One script invocation: the script's name, its KEYS and ARGV in the order its header lists them."""

    script: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Command:
    """A plain command that goes with script calls (a rider of an event's round trip): its name, its one
    key (routes it on a Redis Cluster) and the rest of its arguments. Only commands harmless to repeat
    (`Scripts.execute` may send a pipeline twice): absolute ZADD/ZREM/SREM."""

    name: str
    keys: tuple[str]
    args: tuple[Any, ...]


# -- one wrapper per script (see each .lua header for the contract) -------------------------------------
def acquire(run_id: str, *, token: str, ttl_ms: int, handoff: str) -> Call:
    """acquire.lua: take the lease if free, or if it holds `handoff` ("" = none). Reply 1 taken while free,
    2 taken from the handoff, 3 not taken because this token's process holds it already, 0 not taken."""
    return Call("acquire", (k.lease(run_id), k.rescue(run_id)), (token, ttl_ms, handoff))


def renew(run_id: str, *, token: str, ttl_ms: int) -> Call:
    """renew.lua: extend the lease if `token` still holds it. Reply 1 extended, 0 not."""
    return Call("renew", (k.lease(run_id),), (token, ttl_ms))


def release(run_id: str, *, token: str, handoff: str, handoff_ttl_ms: int) -> Call:
    """release.lua: drop the lease, or leave `handoff` for `handoff_ttl_ms`, if `token` holds it. Reply 1/0."""
    return Call("release", (k.lease(run_id),), (token, handoff, handoff_ttl_ms))


def release_prefix(run_id: str, *, prefix: str) -> Call:
    """release_prefix.lua: drop a dead holder's lease if its value starts with `prefix`. Reply the value
    released, or None."""
    return Call("release_prefix", (k.lease(run_id),), (prefix,))


def raise_epoch(run_id: str, *, epoch: int) -> Call:
    """raise_epoch.lua: raise the epoch mirror to `epoch`, never lower. Reply the mirror afterwards."""
    return Call("raise_epoch", (k.epoch(run_id),), (epoch,))


def append_event(run_id: str, *, epoch: int, maxlen: int, fields: Sequence[str]) -> Call:
    """append_event.lua: append `fields` (name, value pairs) as holder `epoch`. Reply the stream id, or
    None if a newer epoch owns the run."""
    return Call("append_event", (k.epoch(run_id), k.events(run_id)), (epoch, maxlen, *fields))


def rescue(run_id: str, *, grace_ms: int, rescuer: str) -> Call:
    """rescue.lua: "no lease and no rescue out within `grace_ms`" marks one. Reply [1, 0] send a wake-up,
    [0, 0] the lease lives, [2, ms] a rescue is already out and its marker blocks another for ms more."""
    return Call("rescue", (k.lease(run_id), k.rescue(run_id)), (grace_ms, rescuer))


def pop_expired(*, member: str, now_ms: int) -> Call:
    """pop_expired.lua: remove `member` from its run's lease index shard if its deadline passed. Reply 1
    removed, 0 not."""
    return Call("pop_expired", (k.lease_index(k.index_run_id(member)),), (member, now_ms))


def fault_hit(*, point: str, hit: str) -> Call:
    """fault_hit.lua: fire armed fault `point` once more, recording `hit`. Reply 1 fires now, 0 not."""
    return Call("fault_hit", (k.FAULTS, k.FAULT_HITS), (point, hit))


def admit(*, unsent_key: str, user_slots_key: str, slot_owners_key: str, queue_keys: Sequence[str], run_id: str,
          now_ms: int, max_queued: int, max_per_user: int, slot_ttl_ms: int, unsent_ttl_ms: int,
          outside_backlog: int, user_id: str) -> Call:
    """admit.lua: admit `run_id` under the global and per-user limits. Reply {ok, limit, count, extra}."""
    return Call("admit", (unsent_key, user_slots_key, slot_owners_key, *queue_keys),
                (run_id, now_ms, max_queued, max_per_user, slot_ttl_ms, unsent_ttl_ms, outside_backlog, user_id))


def release_slot(*, user_slots_key: str, unsent_key: str, slot_owners_key: str, run_id: str) -> Call:
    """release_slot.lua: give `run_id`'s admission slot back (idempotent). Reply 1 freed, 0 it held none."""
    return Call("release_slot", (user_slots_key, unsent_key, slot_owners_key), (run_id,))


def promote(*, large_queue_key: str, normal_queue_key: str) -> Call:
    """promote.lua: move the oldest large message to the front of the normal queue while both wait. Reply
    the moved message, or None."""
    return Call("promote", (large_queue_key, normal_queue_key), ())
