"""The gateway's JSON codec (agentforge.gateway.wire.decode_json/encode_json) reads every JSON text exactly as
Python's ``json`` does, whichever of its parsers (orjson, pydantic-core, json) takes the input."""

from __future__ import annotations

import json
import math

import pytest
from fuzzing import FUZZ, json_values
from hypothesis import given
from hypothesis import strategies as st

from agentforge.gateway.wire import decode_json, encode_json


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)  # type: ignore[index]
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    return repr(a) == repr(b)


@FUZZ
@given(json_values(), st.booleans())
def test_decode_reads_what_json_reads(value: object, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert _same(decode_json(text.encode("utf-8")), json.loads(text))
    assert _same(decode_json(encode_json(value)), value)


@pytest.mark.parametrize(
    "text",
    [
        "123456789012345678901234567890",  # past 64 bits: stays an int (orjson would read a float)
        "-9223372036854775809",
        "18446744073709551615",
        '{"seed": 99999999999999999999, "x": [1, 2]}',
        "NaN",
        "[Infinity, -Infinity]",
        '"\\ud800"',  # a lone surrogate escape
        '"\\ud83d\\ude00"',
        '{"a": 1, "a": 2}',
        "1e400",
        '"\\u0000"',
    ],
)
def test_decode_edge_cases_match_json(text: str) -> None:
    assert _same(decode_json(text.encode()), json.loads(text))


def test_decode_errors_stay_value_and_unicode_errors() -> None:
    with pytest.raises(ValueError):
        decode_json(b'{"a": ')
    with pytest.raises(ValueError):
        decode_json(b"[" * 5000 + b"]" * 5000)
    with pytest.raises(UnicodeDecodeError):
        decode_json(b'"\xff"')
