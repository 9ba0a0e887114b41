"""Compact JSON with sorted keys for what the hot path stores: checkpoints and event data.

orjson encodes a checkpoint's history several times faster than the standard library's encoder, which
was the largest single item of a loaded worker's CPU on long runs (issue 17). Its bytes are used only
when they read back as exactly the value given (`==`); otherwise the standard library's are, the bytes
this project wrote before. That keeps every value's meaning where the two differ: NaN and Infinity
(orjson writes null; the standard library NaN, which `json.loads` reads back), integers beyond 64 bits,
lone surrogates (orjson refuses them), tuples, and types orjson would turn into strings (datetime, UUID,
dataclasses, enums: the standard library refuses them, as it did). Reading stays `json.loads`, which
reads both encoders' bytes exactly (orjson's reader turns integers beyond 64 bits into floats).

`dumps_with_list` writes a value one of whose lists is given already encoded, item by item: a
checkpoint's history entries are each encoded once (checkpoints.history.EntryBytes), not at every write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson

_OPTIONS = orjson.OPT_SORT_KEYS


def _exact(value: Any) -> bytes | None:
    """orjson's bytes of `value` if they read back as exactly `value`, else None."""
    try:
        out = orjson.dumps(value, option=_OPTIONS)
        if orjson.loads(out) == value:
            return out
    except (TypeError, ValueError):  # orjson.JSONEncodeError and JSONDecodeError are both
        pass
    return None


def dumps(value: Any) -> bytes:
    """`value` as compact JSON with sorted keys, UTF-8; raises TypeError/ValueError as `json.dumps` does."""
    out = _exact(value)
    if out is not None:
        return out
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def dumps_with_list(value: dict[str, Any], key: str, items: Sequence[bytes]) -> bytes:
    """What `dumps({**value, key: [...]})` writes, the list's items given as each one's `dumps` bytes: the
    same meaning, read back by `json.loads` (item bytes are spliced in as they are, not encoded again)."""
    if key in value:
        raise ValueError(f"{key!r} is both in the value and the list given beside it")
    if _exact(value) is None:  # the standard library's bytes for the rest: rare, so the plain way
        return dumps({**value, key: [json.loads(item) for item in items]})
    return orjson.dumps({**value, key: orjson.Fragment(b"[" + b",".join(items) + b"]")}, option=_OPTIONS)
