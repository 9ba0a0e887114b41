"""fenced_core.jsonbytes: orjson's bytes where they read back as exactly the value, the standard library's
otherwise, so a checkpoint or an event keeps every value's meaning (issue 17 moved the hot path to it)."""

from __future__ import annotations

import datetime
import json
import math
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checkpoints import codec
from fenced_core import jsonbytes


def _stdlib(value: object) -> str:
    """The standard library's compact, sorted JSON (what the checkpoint codec wrote before orjson)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)

# What JSON can hold, as Python gives it to us: any float (NaN and infinities too), any integer.
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)


def _same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN, and of the same types all the way down (1 is not 1.0 or True)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@given(values)
def test_what_is_written_reads_back_as_the_standard_librarys_bytes_do(value: object) -> None:
    assert _same(json.loads(jsonbytes.dumps(value)), json.loads(_stdlib(value)))


@pytest.mark.parametrize("value, stdlib_bytes", [
    ({"score": float("nan")}, b'{"score":NaN}'),  # orjson would write null
    ({"x": float("inf"), "y": -float("inf")}, b'{"x":Infinity,"y":-Infinity}'),
    ({"big": 2**70}, b'{"big":1180591620717411303424}'),  # orjson refuses it (and its reader makes a float)
    ({"neg": -(2**63) - 1}, b'{"neg":-9223372036854775809}'),
    ({"s": "\ud800"}, b'{"s":"\\ud800"}'),  # a lone surrogate: orjson refuses it
    ({"t": (1, 2)}, b'{"t":[1,2]}'),  # a tuple reads back as a list: not equal, so the standard library's
    ({3: "x"}, b'{"3":"x"}'),  # an integer key reads back as a string
])
def test_values_orjson_would_change_are_written_by_the_standard_library(value: object, stdlib_bytes: bytes) -> None:
    assert jsonbytes.dumps(value) == stdlib_bytes


@pytest.mark.parametrize("value", [datetime.datetime(2026, 12, 3, 12, 0), uuid.UUID(int=7), {1j: 1}, {"o": object()},
                                   {3: "x", "a": "y"}])
def test_what_the_standard_library_refuses_is_refused_still(value: object) -> None:
    """orjson writes datetimes and UUIDs as strings (a checkpoint would read back another type) and sorts
    mixed integer and string keys, which the standard library cannot."""
    with pytest.raises(TypeError):
        jsonbytes.dumps(value)


def test_plain_data_takes_orjsons_bytes_sorted_and_compact() -> None:
    value = {"b": [1, 2.5, None, True], "a": {"z": "é", "y": "line\n"}}
    out = jsonbytes.dumps(value)
    assert out == '{"a":{"y":"line\\n","z":"é"},"b":[1,2.5,null,true]}'.encode()
    assert out != _stdlib(value).encode()  # the standard library escapes é: these are orjson's


def test_a_checkpoint_blob_round_trips_exactly() -> None:
    checkpoint = {"history": [{"step": 0, "results": {"c1": [{"price": 19.99, "name": "Kettle — 1.7 l"}]}}],
                  "decision": {"answer": None, "score": float("nan")}}
    back = codec.decode(codec.encode(checkpoint))
    assert _same(back, checkpoint)


@given(st.dictionaries(st.text(max_size=6).filter(lambda k: k != "items"), values, max_size=4),
       st.lists(values, max_size=5))
def test_a_list_given_encoded_reads_back_as_if_encoded_with_the_rest(rest: dict, items: list) -> None:
    """checkpoints.history splices each entry's bytes into the checkpoint instead of encoding them again."""
    spliced = jsonbytes.dumps_with_list(rest, "items", [jsonbytes.dumps(i) for i in items])
    assert _same(json.loads(spliced), json.loads(jsonbytes.dumps({**rest, "items": items})))


def test_a_list_given_encoded_beside_a_value_orjson_would_change() -> None:
    out = jsonbytes.dumps_with_list({"score": float("nan")}, "h", [jsonbytes.dumps({"a": 2**70})])
    assert out == b'{"h":[{"a":1180591620717411303424}],"score":NaN}'
    assert jsonbytes.dumps_with_list({"b": 1}, "a", [b'{"x":1}', b"2"]) == b'{"a":[{"x":1},2],"b":1}'
    with pytest.raises(ValueError, match="'a' is both"):
        jsonbytes.dumps_with_list({"a": 1}, "a", [])


@given(values)
def test_loads_reads_what_the_standard_library_reads(value: object) -> None:
    for written in (jsonbytes.dumps(value), _stdlib(value).encode()):
        assert _same(jsonbytes.loads(written), json.loads(written)), written


@pytest.mark.parametrize("written", [
    b'{"big":1180591620717411303424}', b'[18446744073709551616]', b'[-9223372036854775809]',  # orjson: floats
    b'{"score":NaN}', b'[Infinity,-Infinity]', b'[1e400]', b'{"s":"\\ud800"}',  # orjson refuses them
    b'{"id":"call_1234567890123456789012"}', b'[0.12345678901234567890123]', b'[18446744073709551615]',
])
def test_loads_keeps_what_orjsons_reader_would_change(written: bytes) -> None:
    assert _same(jsonbytes.loads(written), json.loads(written))


def test_a_blob_with_a_big_integer_decodes_exactly() -> None:
    blob = codec.encode({"history": [{"n": 2**70, "m": -(2**63) - 1, "f": float("nan")}]})
    [entry] = codec.decode(blob)["history"]
    assert entry["n"] == 2**70 and type(entry["n"]) is int and entry["m"] == -(2**63) - 1
    assert math.isnan(entry["f"])


@given(st.lists(st.sampled_from([b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8", b"9", b"a", b".", b"-", b'"',
                                 b"e", b"\xc3\xa9"]), max_size=60).map(b"".join))
def test_the_long_digit_check_finds_exactly_nineteen_digits_in_a_row(data: bytes) -> None:
    """The fast check (translate + substring) says what the regular expression [0-9]{19} says."""
    import re

    assert jsonbytes._has_long_digits(data) == (re.search(rb"[0-9]{19}", data) is not None), data


@pytest.mark.parametrize("digit", "0123456789")
def test_every_digit_counts_in_a_long_run(digit: str) -> None:
    assert jsonbytes._has_long_digits(f'{{"n":{digit * 19}}}'.encode())
    assert not jsonbytes._has_long_digits(f'{{"n":{digit * 18}}}'.encode())
