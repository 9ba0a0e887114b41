"""One round trip of queued commands on a pooled connection: what `Pipeline.execute` does for a
non-transactional pipeline, without the per-execute machinery redis-py 8 wraps around it.

Why it exists (issue 17, measured): every fenced step sends ~5 pipelines (lease, event appends,
renewal, release), and redis-py's `Pipeline.execute` spent about twice the CPU of the exchange itself
on work fenced never uses: a deprecation-argument check on every pool checkout, the HIMPORT fieldset
scan of every queued command, observability records, a second `reset`, and a pure-Python per-argument
pass before hiredis packs each command.

What stays redis-py's: the connection pool (checkout, its health check, release), the connection
(connect, AUTH, CLIENT SETNAME, send, hiredis's reply parser), the client's retry policy
(`connection.retry`, as `Pipeline.execute` uses it: a failed exchange disconnects and is sent again) and
the client's response callbacks (a ZADD's or an EXISTS's reply reads as through the pipeline).
Only for redis.Redis clients (fenced's own, Sentinel's): a Redis Cluster pipeline routes commands per
node, so fencing.scripts leaves those to `Pipeline.execute`.

Error replies are returned in place (or the first one raised, `raise_on_error`), as the pipeline does;
driver errors leave as RedisUnavailable (fencing.fenced_redis)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.client import EMPTY_RESPONSE, NEVER_DECODE
from redis.exceptions import ResponseError

from fencing.fenced_redis import translate_driver_error

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # redis-py's own packer does it then
    _hiredis_pack = None

Queued = tuple[tuple[Any, ...], dict[str, Any]]  # (args, options): a Pipeline's command_stack entry


def exchange(client: redis.Redis, commands: Sequence[Queued], raise_on_error: bool = True) -> list[Any]:
    """Send `commands` (a pipeline's `command_stack`) in one write, read every reply; the replies in order."""
    if not commands:
        return []
    pool = client.connection_pool
    try:
        conn = pool.get_connection()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise translate_driver_error(exc) from exc
    try:
        # A failed exchange has dropped the connection already (_send_and_read): the retry reconnects it.
        replies = conn.retry.call_with_retry(lambda: _send_and_read(client, conn, commands), lambda _error: None)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise translate_driver_error(exc) from exc
    finally:
        pool.release(conn)
    if raise_on_error:
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
    return replies


def pack(conn: Any, commands: Sequence[Queued]) -> list[bytes]:
    """The wire bytes of `commands`: hiredis packs each directly when every argument is a str, bytes or
    int (all fenced queues); anything else (a float, a memoryview, a two-word command name) goes through
    the connection's own packer, which encodes it as redis-py does."""
    if _hiredis_pack is not None and all(_plain(args) for args, _options in commands):
        return [b"".join(_hiredis_pack(args) for args, _options in commands)]
    return conn.pack_commands([args for args, _options in commands])


def _plain(args: tuple[Any, ...]) -> bool:
    if not isinstance(args[0], str) or " " in args[0]:
        return False
    for a in args:
        kind = type(a)
        if kind is not str and kind is not bytes and kind is not int:
            return False
    return True


def _send_and_read(client: redis.Redis, conn: Any, commands: Sequence[Queued]) -> list[Any]:
    try:
        conn.send_packed_command(pack(conn, commands))
        callbacks = client.response_callbacks
        replies: list[Any] = []
        for args, options in commands:
            try:
                reply = conn.read_response(disable_decoding=True) if NEVER_DECODE in options else conn.read_response()
            except ResponseError as exc:
                replies.append(options[EMPTY_RESPONSE] if EMPTY_RESPONSE in options else exc)
                continue
            callback = callbacks.get(args[0])
            if callback is not None:
                extra = {k: v for k, v in options.items() if k not in (NEVER_DECODE, EMPTY_RESPONSE, "keys")}
                reply = callback(reply, **extra)
            replies.append(reply)
        return replies
    except BaseException:
        # Replies may be left unread on the socket: it must not go back to the pool as it is.
        conn.disconnect()
        raise
