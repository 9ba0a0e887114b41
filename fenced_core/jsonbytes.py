"""Compact JSON with sorted keys for what the hot path stores: checkpoints and event data.

orjson encodes a checkpoint's history several times faster than the standard library's encoder, which
was the largest single item of a loaded worker's CPU on long runs (issue 17). Its bytes are used only
when they read back as exactly the value given (`==`); otherwise the standard library's are, the bytes
this project wrote before. That keeps every value's meaning where the two differ: NaN and Infinity
(orjson writes null; the standard library NaN, which `json.loads` reads back), integers beyond 64 bits,
lone surrogates (orjson refuses them), tuples, and types orjson would turn into strings (datetime, UUID,
dataclasses, enums: the standard library refuses them, as it did). Reading stays `json.loads`, which
reads both encoders' bytes exactly (orjson's reader turns integers beyond 64 bits into floats).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_OPTIONS = orjson.OPT_SORT_KEYS


def dumps(value: Any) -> bytes:
    """`value` as compact JSON with sorted keys, UTF-8; raises TypeError/ValueError as `json.dumps` does."""
    try:
        out = orjson.dumps(value, option=_OPTIONS)
        if orjson.loads(out) == value:
            return out
    except (TypeError, ValueError):  # orjson.JSONEncodeError and JSONDecodeError are both
        pass
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
