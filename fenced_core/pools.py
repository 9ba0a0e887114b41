"""Which Celery pool a worker command line names: read by celeryconfig (threads unless the command names one)."""

from __future__ import annotations

from collections.abc import Sequence


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
