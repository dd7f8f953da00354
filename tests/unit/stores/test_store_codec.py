"""The store's JSON writer: orjson where it says the same thing, pydantic-core or ``json`` where it cannot."""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest

from agentforge.stores.codec import fast_json, loads, stamped
from agentforge.stores.tables import _llm_json
from agentforge.types import LLMCall, Span, SpanKind, ToolCall

NON_FINITE = [-math.inf, math.inf, 0.5]


@pytest.mark.parametrize(
    "value",
    [
        {"logprobs": NON_FINITE},  # orjson would write null: the fallback keeps the constants
        {"a": None, "b": [1, None]},
        {"when": dt.datetime(2026, 12, 1, 18, 0, tzinfo=dt.UTC)},  # not orjson-native here
        {1: "int key"},
        {"big": 2**70},
        {"set": {1}},
        {"text": "nul \x00 emoji 👩‍👩‍👧 cjk 中文 quote “x”"},
        {"lone": "\ud800"},
        [],
        "plain",
    ],
)
def test_fast_json_reads_back_as_pydantic_or_json_would_write_it(value: object) -> None:
    from pydantic_core import to_json, to_jsonable_python

    out = fast_json(value)
    try:
        expected = json.loads(to_json(value, inf_nan_mode="constants"))
    except Exception:  # lone surrogates: only Python's json writes and reads them
        expected = json.loads(json.dumps(value, default=to_jsonable_python))
    got = loads(out.decode("utf-8"))
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert b"\x00" not in out


def test_nan_survives_the_fast_path_fallback() -> None:
    out = loads(fast_json({"x": [math.nan]}).decode())
    assert math.isnan(out["x"][0])


def test_llm_json_round_trips_the_record_exactly() -> None:
    call = LLMCall(
        model="policy",
        version="policy@v2",
        request={"messages": [{"role": "user", "content": "✨ card?"}], "tool_choice": None},
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[4, 5],
        logprobs=[-math.inf, -0.25],
        tool_calls=[ToolCall(id="c1", name="lookup", arguments='{"id": 1}', parsed={"id": 1})],
        finish_reason="tool_calls",
        latency_s=0.01,
    )
    back = LLMCall.model_validate_json(_llm_json(call))
    assert back == call
    plain = call.model_copy(
        update={"tool_calls": [], "request": {"model": "policy"}, "logprobs": [-0.5, -0.25]}
    )
    assert LLMCall.model_validate_json(_llm_json(plain)) == plain


def test_stamped_is_the_copy_model_copy_makes() -> None:
    span = Span(kind=SpanKind.llm, name="chat", attributes={"k": [1]})
    fields = {"sequence": 7, "rollout_id": "ro-1", "attempt_id": "at-1"}
    copy = stamped(span, fields)
    reference = span.model_copy(update=fields)
    assert copy == reference and copy is not span
    assert copy.model_fields_set == reference.model_fields_set
    assert span.sequence != 7 and span.rollout_id is None  # the original is untouched
    assert copy.attributes is span.attributes  # shallow, as model_copy
