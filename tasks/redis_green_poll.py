"""In a gevent worker, redis-py's check of every connection it takes from a pool asks the kernel directly.

redis-py checks each connection it hands out from a pool for unread data: `can_read()` with a zero
timeout, which hiredis' parser answers with `select.poll()` and one poll. Under gevent's monkey patching
`select.poll` is gevent's, whose zero-timeout poll still builds io watchers and switches through the hub:
37 us of CPU a checkout and release against 12 us with the kernel's poll (issue 17, measured in a
patched process against a local Redis), paid on every fenced Redis round trip and every kombu publish of
a gevent worker. A poll with a zero timeout returns at once, so it cannot stall the other greenlets: here
it goes to the original `select.poll`; a poll with any other timeout still goes to gevent's, which blocks
only the greenlet that asked. celeryconfig installs it; a process gevent has not patched is left as it is.
Remove it once redis-py checks pooled connections without a poll object, or gevent's zero-timeout poll
stops switching.
"""

from __future__ import annotations

import select
import sys
import types
from typing import Any

import redis._parsers.hiredis as hiredis_parser

_PATCHED = "_fenced_kernel_poll"


def install() -> bool:
    """Point hiredis' parser at a `select` whose zero-timeout polls are the kernel's; True once installed."""
    current = getattr(hiredis_parser, "select", None)
    if getattr(current, _PATCHED, False):
        return True
    if current is None or "gevent" not in sys.modules:  # a redis-py that polls elsewhere: left as it is
        return False
    from gevent import monkey

    if not monkey.is_module_patched("select") or not hasattr(select, "poll"):
        return False
    kernel_poll = monkey.get_original("select", "poll")
    green_poll = select.poll

    class Poll:
        """select.poll's interface: registrations kept, the poll made by the kernel when it cannot wait."""

        def __init__(self) -> None:
            self._registered: list[tuple[Any, int]] = []

        def register(self, fd: Any, eventmask: int = select.POLLIN | select.POLLPRI | select.POLLOUT) -> None:
            self._registered.append((fd, eventmask))

        def poll(self, timeout: float | None = None) -> list[tuple[int, int]]:
            poller = kernel_poll() if timeout == 0 else green_poll()
            for fd, eventmask in self._registered:
                poller.register(fd, eventmask)
            return poller.poll(timeout)

    names = {name: getattr(select, name) for name in dir(select) if not name.startswith("__")}
    hiredis_parser.select = types.SimpleNamespace(**{**names, "poll": Poll, _PATCHED: True})  # type: ignore[assignment]
    return True
