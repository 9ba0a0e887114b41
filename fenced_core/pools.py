"""Which Celery pool a worker command line names (threads unless it names one), and its default concurrency."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from types import FrameType


def pool_option(pool: str) -> list[str]:
    return ["--pool", pool]


def split_pool(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """Take every `--pool X`, `--pool=X`, `-P X` or `-PX` out of `args`; returns (the last pool, the rest)."""
    pool, rest = None, []
    it = iter(args)
    for arg in it:
        if arg in ("--pool", "-P"):
            pool = next(it, None)
        elif arg.startswith("--pool="):
            pool = arg.split("=", 1)[1]
        elif arg.startswith("-P") and len(arg) > 2:
            pool = arg[2:]
        else:
            rest.append(arg)
    return pool, rest


# Steps wait on the model, so a thread (or greenlet) per run in flight is cheap: about 0.3-0.6 MiB each,
# measured with `python -m bench.inflight` (docs/benchmarks.md, "In flight"). On the 2-core machine there,
# two processes kept ~100-130 two-second-step runs at >= 80 % of their ideal pace; past that the CPU per
# step, not the thread count, is the limit. 64 per process with the default prefetch leaves room for runs
# to wait on the model without a slot going idle.
THREADS_CONCURRENCY = 64
GREEN_POOLS = ("threads", "gevent", "eventlet")


def default_concurrency(pool: str | None, configured: int | None) -> int | None:
    """FENCED_CONCURRENCY when set; else THREADS_CONCURRENCY for the threads (or a green) pool, and None for
    prefork and solo: Celery's own default there (one process per CPU)."""
    if configured is not None:
        return configured
    return THREADS_CONCURRENCY if (pool or "threads") in GREEN_POOLS else None


# The files of gevent's and eventlet's monkey patching. Both walk every live object to swap the locks
# that exist already; an `isinstance` on one of Celery's lazy proxies then loads the default app's
# configuration, i.e. imports `celeryconfig` in the middle of the patching: after threading, before
# socket and select. Whatever it imported then (kombu's poller, redis-py) kept the blocking originals,
# and one greenlet waiting in kombu's select stopped every other (docs/benchmarks.md, "gevent, unfrozen").
_GREEN_PATCHERS = (f"{os.sep}gevent{os.sep}monkey{os.sep}", f"{os.sep}eventlet{os.sep}patcher.py")


def imported_while_green_patching() -> bool:
    """True when the caller is being imported from inside gevent's or eventlet's monkey patching."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in _GREEN_PATCHERS):
            return True
        frame = frame.f_back
    return False


def off_the_hub(fn: Callable[[], None]) -> None:
    """Call `fn` now; on a gevent worker's hub (where Celery runs its signal handlers, as loop callbacks
    that may not block) in a new greenlet instead, since `fn` does I/O or starts a timer."""
    gevent = sys.modules.get("gevent")
    if gevent is not None and gevent.getcurrent() is gevent.get_hub():
        gevent.spawn(fn)
        return
    fn()
