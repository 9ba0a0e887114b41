"""Compact JSON with sorted keys for what the hot path stores: checkpoints and event data.

orjson encodes a checkpoint's history several times faster than the standard library's encoder, which
was the largest single item of a loaded worker's CPU on long runs (issue 17). Its bytes are used only
when they read back as exactly the value given (`==`); otherwise the standard library's are, the bytes
this project wrote before. That keeps every value's meaning where the two differ: NaN and Infinity
(orjson writes null; the standard library NaN, which `json.loads` reads back), integers beyond 64 bits,
lone surrogates (orjson refuses them), tuples, and types orjson would turn into strings (datetime, UUID,
dataclasses, enums: the standard library refuses them, as it did). `loads` reads both encoders' bytes
as `json.loads` does: through orjson's reader where it gives the same value, else the standard library's
(orjson's reader turns integers beyond 64 bits into floats, and refuses NaN, Infinity and lone surrogates).

`dumps_with_list` writes a value one of whose lists is given already encoded, item by item: a
checkpoint's history entries are each encoded once (checkpoints.history.EntryBytes), not at every write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson

_OPTIONS = orjson.OPT_SORT_KEYS
# Nineteen digits in a row: an integer orjson's reader might turn into a float (one below -2**63 has 19).
# Found inside a string or a fraction too, where it only sends the read the standard library's way.
# Looked for as nineteen zeros in the bytes with every digit made a zero: bytes.translate and a substring
# search run in C, about a tenth of what the regular expression [0-9]{19} cost on a history segment
# (~13 vs ~160 us on 9 KB, the largest item of a long run's claim).
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS = b"0" * 19


def _has_long_digits(data: bytes) -> bool:
    """Whether `data` holds nineteen ASCII digits in a row."""
    return _LONG_DIGITS in data.translate(_DIGITS_AS_ZERO)


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


def loads(data: bytes) -> Any:
    """What `json.loads(data)` returns, read faster where orjson's reader returns exactly that: any JSON
    without a run of 19 digits (every integer then fits orjson's 64 bits, and its floats are correctly
    rounded, as the standard library's are) and without NaN, Infinity or a lone surrogate (which orjson
    refuses: then the standard library reads them, as before)."""
    if not _has_long_digits(data):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def dumps_with_list(value: dict[str, Any], key: str, items: Sequence[bytes]) -> bytes:
    """What `dumps({**value, key: [...]})` writes, the list's items given as each one's `dumps` bytes: the
    same meaning, read back by `json.loads` (item bytes are spliced in as they are, not encoded again)."""
    if key in value:
        raise ValueError(f"{key!r} is both in the value and the list given beside it")
    if _exact(value) is None:  # the standard library's bytes for the rest: rare, so the plain way
        return dumps({**value, key: [json.loads(item) for item in items]})
    return orjson.dumps({**value, key: orjson.Fragment(b"[" + b",".join(items) + b"]")}, option=_OPTIONS)
