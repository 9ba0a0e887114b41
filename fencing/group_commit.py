"""Event appends from the runs one process holds share Redis round trips (leader/follower group commit).

An append that finds no round trip of appends in flight sends at once, alone: nothing waits, a lone
run pays exactly what it paid before. Appends that arrive while one is in flight queue up, and the
first of them to wake once it is back sends them all in the next one. So the batches grow with the
load by themselves, with no timer, and a queued append waits at most for the round trip ahead of
it. Measured on the 2-core box (`python -m bench.batching`, 2026-12-03): an append costs ~120 µs of
client CPU alone in its round trip and ~25 µs ten to a round trip.

What stays as it was: every append is still its own fenced script call (`append_event`, and
`raise_epoch` for a claim's first), checked by Redis against its own run's epoch mirror; the batch
changes how many round trips carry the calls, not what Redis does with any of them. A refused one is
refused for its run only (its caller raises FencedOut; the others' replies stand). A run's own appends
are sequential (its step waits for each reply before the next), so their order holds; across runs
there is no order to keep. A round trip that fails (Redis unreachable, a timeout) fails every append
it carried, each caller raising RedisUnavailable as it would have alone: such an append may or may
not have landed, as before (clients merge events by id).

Only for a plain Redis or Sentinel client; a Redis Cluster client sends each run's appends alone
(its pipelines split by slot anyway). Threads and gevent alike: the condition below is a green one
once gevent has patched threading (Celery's gevent pool patches before anything here is imported).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from fenced_core.errors import StoreUnavailable
from fencing.cluster import is_cluster
from fencing.fenced_redis import RedisUnavailable
from fencing.scripts import Call, Command, scripts_for

_ATTR = "_fenced_group_commit"


@dataclass
class _Waiting:
    calls: Sequence[Call | Command]
    replies: list[Any] = field(default_factory=list)
    error: BaseException | None = None
    done: bool = False


class GroupCommit:
    """One client's shared round trips of script calls; `send` returns the caller's own replies."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.scripts = scripts_for(client)
        self._cond = threading.Condition()
        self._queued: list[_Waiting] = []
        self._sending = False
        # Round trips sent and calls they carried, for tests and benchmarks (approximate under threads).
        self.trips = 0
        self.calls = 0

    def send(self, calls: Sequence[Call | Command]) -> list[Any]:
        """Run `calls` (one caller's, in order) in a round trip shared with whatever else is queued;
        their replies, an error among them raised (the first)."""
        me = _Waiting(calls)
        with self._cond:
            self._queued.append(me)
            while self._sending and not me.done:
                self._cond.wait()
            if not me.done:  # lead: send everything queued, this caller's calls among them
                self._sending = True
                batch, self._queued = self._queued, []
        if not me.done:
            self._lead(batch)
        if me.error is not None:  # the round trip failed under another caller (the leader's raised already)
            raise _as_own(me.error)
        for reply in me.replies:
            if isinstance(reply, Exception):
                raise reply
        return me.replies

    def _lead(self, batch: list[_Waiting]) -> None:
        calls = [call for waiting in batch for call in waiting.calls]
        replies: list[Any] = []
        error: BaseException | None = None
        try:
            replies = self.scripts.execute_all(self.client, calls, raise_on_error=False)
        except BaseException as exc:  # every caller learns it; the leader's own BaseException goes on up
            error = exc
            raise
        finally:
            with self._cond:
                at = 0
                for waiting in batch:
                    waiting.replies = replies[at:at + len(waiting.calls)]
                    at += len(waiting.calls)
                    waiting.error = error
                    waiting.done = True
                self.trips += 1
                self.calls += len(calls)
                self._sending = False
                self._cond.notify_all()


def _as_own(error: BaseException) -> Exception:
    """A follower's own exception for the failure of the round trip that carried its calls (one
    exception object is never raised in two threads or greenlets at once): RedisUnavailable for a store
    error or an interruption of the leader, the same class otherwise."""
    if isinstance(error, StoreUnavailable) or not isinstance(error, Exception):
        own: Exception = RedisUnavailable(f"the shared round trip of event appends failed: {error!r}")
    else:
        try:
            own = type(error)(*error.args)
        except Exception:
            own = RuntimeError(f"the shared round trip of event appends failed: {error!r}")
    own.__cause__ = error
    return own


def send(client: redis.Redis, calls: Sequence[Call | Command]) -> list[Any]:
    """`calls` in a round trip shared with other runs' appends on this client (alone on a cluster)."""
    if is_cluster(client):
        return scripts_for(client).execute_all(client, calls)
    group: GroupCommit | None = client.__dict__.get(_ATTR)
    if group is None:
        group = client.__dict__.setdefault(_ATTR, GroupCommit(client))
    return group.send(calls)
