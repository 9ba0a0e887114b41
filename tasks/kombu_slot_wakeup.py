"""A gevent or eventlet worker takes its next message within 10 ms of a slot coming free, not up to 2 s later.

With a green pool Celery runs its consumer as a blocking loop (celery.worker.loops.synloop) that calls
`connection.drain_events(timeout=2.0)`, which for kombu's Redis transport is `MultiChannelPoller.get`,
called again after each empty round. While every slot is taken (the channel's QoS cannot consume: the
prefetch limit is reached) `get` sends no BRPOP and waits on the other sockets (the remote-control
pidbox's) for the whole timeout, or sleeps up to 1 s when there are none. A delivery that ends meanwhile
frees a slot nobody looks at until that wait is over. Measured (issue 17, `python -m bench.cpu_split
--pool gevent --concurrency 4`, zero-latency 4-step runs): 4.1 runs/s, each batch of four waiting ~2 s
for the next; 79 runs/s with this module. Under 1,000 runs in flight on 2 x gevent 500 it is the wait
between a step's handover and the next step's start, and between a rescue and its claim.

Here a `get` called while a channel with queues cannot consume waits at most SLICE_S; the transport's
drain loop (kombu's virtual `Transport.drain_events`, which runs until its own timeout) then calls `get`
again, which sends the BRPOP as soon as a slot is free. With a slot free `get` is kombu's own, and the
threads and prefork pools' event loop never calls it. The cost while starved is one poll round per
SLICE_S, and kombu's unacked-restore sweep (which runs on every tenth empty round: a mutex and a
ZRANGE) then runs about every 100 ms instead of every 10-20 s. Remove this module once Celery or kombu
wake the consumer when a slot frees.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

SLICE_S = 0.01
_PATCHED = "_fenced_slot_wakeup"


def _starved(cycle: Any) -> bool:
    """Whether a channel of the poller consumes queues but may not take another message now."""
    return any(channel.active_queues and not channel.qos.can_consume() for channel in cycle._channels)


def install() -> None:
    """Patch kombu's Redis poller (the Sentinel transport shares it) once per process."""
    poller = kombu_redis.MultiChannelPoller
    if getattr(poller, _PATCHED, False):
        return
    original = poller.get

    def get(self: Any, callback: Any, timeout: float | None = None) -> Any:
        if (timeout is None or timeout > SLICE_S) and _starved(self):
            timeout = SLICE_S
        return original(self, callback, timeout)

    poller.get = get  # type: ignore[method-assign]
    setattr(poller, _PATCHED, True)
