"""Fast takeover: notice a dead holder process in about a second instead of when its lease runs out.

A process that died closes its sockets, so its named Redis connections vanish; a prefork parent sees
its child die. Acting on that is safe: epochs fence a mistaken takeover, so a false positive costs
work, never correctness. Frozen or cut-off processes keep their connections and still wait for the
lease TTL.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import structlog

from fenced_core.settings import get_settings
from fencing import keys, scripts
from fencing.connection import CLIENT_NAME_PREFIX, connected_names, get_redis, process_token
from fencing.lease import now_ms
from fencing.reaper import rescue, rescue_many
from fencing.scripts import scripts_for
from fencing.turns import take_turn

log = structlog.get_logger("fencing.liveness")
Send = Callable[[str], None]
MISSES_TO_PRESUME_DEAD = 2  # consecutive checks without a connection


def check_connections(send: Send) -> list[str]:
    """One connection check (one worker per tick): holders with no connection twice in a row are dead.

    Returns the runs rescued. Cost: CLIENT LIST and the registry of lease-holding processes; a process
    presumed dead costs O(the leases it took), read from its own set."""
    s = get_settings()
    client = get_redis()
    if not take_turn(client, keys.LIVENESS_LOCK, process_token(), s.liveness_tick_ms):
        return []
    holders: list[str] = client.zrange(keys.PROCESSES, 0, -1)  # type: ignore[assignment]
    if not holders:
        return []
    connected = connected_names(client)
    pipe = client.pipeline(transaction=False)
    for token in holders:
        if CLIENT_NAME_PREFIX + token in connected:
            pipe.hdel(keys.LIVENESS_SUSPECTS, token)
        else:
            pipe.hincrby(keys.LIVENESS_SUSPECTS, token, 1)
    misses = pipe.execute()
    rescued: list[str] = []
    for token, seen in zip(holders, misses, strict=True):
        if CLIENT_NAME_PREFIX + token not in connected and int(seen) >= MISSES_TO_PRESUME_DEAD:
            rescued += presume_dead(token, send)
    return rescued


def presume_dead(token: str, send: Send) -> list[str]:
    """Release every lease `token` holds and rescue those runs now."""
    client = get_redis()
    pipe = client.pipeline(transaction=False)
    pipe.zrem(keys.PROCESSES, token)
    pipe.hdel(keys.LIVENESS_SUSPECTS, token)
    pipe.zadd(keys.PRESUMED_DEAD, {token: now_ms()})
    pipe.zremrangebyscore(keys.PRESUMED_DEAD, "-inf", now_ms() - 3_600_000)
    pipe.execute()
    reason = f"holder process {token} has no Redis connection on {MISSES_TO_PRESUME_DEAD} checks: presumed dead"
    rescued = _release_and_rescue(token, reason, send)
    log.warning("presumed_dead", token=token, runs=len(rescued))
    return rescued


def child_died(run_id: str, pid: int, send: Send) -> bool:
    """A prefork pool child died running `run_id`: release its lease (if still its own) and rescue now."""
    prefix = f"{socket.gethostname()}:{pid}:"
    client = get_redis()
    released = scripts_for(client)(scripts.release_prefix(run_id, prefix=prefix))
    if not released:
        return False
    client.zrem(keys.lease_index(run_id), keys.index_member(run_id, released))
    return rescue(run_id, get_settings().lease_ttl_ms, f"pool child {pid} died running the step", send)


def _release_and_rescue(token: str, reason: str, send: Send) -> list[str]:
    """Release and rescue the runs `token` held: the runs it recorded taking, checked against the lease."""
    client = get_redis()
    prefix = f"{token}/"
    pipe = client.pipeline(transaction=True)
    pipe.smembers(keys.held_by(token))
    pipe.delete(keys.held_by(token))
    run_ids: list[str] = sorted(pipe.execute()[0])
    if not run_ids:
        return []
    pipe = client.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.get(keys.lease(run_id))
    held = [r for r, value in zip(run_ids, pipe.execute(), strict=True) if value and value.startswith(prefix)]
    if not held:
        return []
    registered = scripts_for(client)
    values = registered.execute_all(client, [scripts.release_prefix(run_id, prefix=prefix) for run_id in held])
    released = [(run_id, value) for run_id, value in zip(held, values, strict=True) if value]
    if not released:
        return []
    pipe = client.pipeline(transaction=False)
    for run_id, value in released:
        pipe.zrem(keys.lease_index(run_id), keys.index_member(run_id, value))
    pipe.execute()
    return rescue_many([run_id for run_id, _value in released], get_settings().lease_ttl_ms, reason, send)
