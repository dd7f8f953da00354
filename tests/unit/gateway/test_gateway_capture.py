"""Pure capture logic: tool-argument rules, stream folding, consistency flags, response shaping."""

from __future__ import annotations

import json

import pytest

from agentforge.gateway.capture import StreamCapture, llm_call_from_response
from agentforge.gateway.router import Upstream
from agentforge.gateway.wire import (
    ClientAsk,
    client_ask,
    shape_chunk,
    shape_response,
    upstream_body,
    upstream_error_body,
)
from agentforge.toolcalls import (
    EMPTY_ARGUMENTS,
    MALFORMED_ARGUMENTS,
    parse_tool_arguments,
    tool_error_messages,
)


@pytest.mark.parametrize(
    ("raw", "parsed", "flags"),
    [
        ("", {}, [EMPTY_ARGUMENTS]),
        ("  ", {}, [EMPTY_ARGUMENTS]),
        (None, {}, [EMPTY_ARGUMENTS]),
        ('{"city": "Paris"}', {"city": "Paris"}, []),
        ('{"code": "if (x) {"}', {"code": "if (x) {"}, []),  # a brace inside a string is valid JSON
        ('{"code": "}}}"}', {"code": "}}}"}, []),
        ('{"city": "Par', None, [MALFORMED_ARGUMENTS]),  # truncated
        ('{"a": 1', None, [MALFORMED_ARGUMENTS]),  # unbalanced brace
        ('{"a": 1}}', None, [MALFORMED_ARGUMENTS]),  # stray brace
        ("[1, 2]", None, [MALFORMED_ARGUMENTS]),  # not an object
    ],
)
def test_parse_tool_arguments(raw: str | None, parsed: dict | None, flags: list[str]) -> None:
    got, got_flags, problem = parse_tool_arguments(raw)
    assert got == parsed
    assert got_flags == flags
    assert (problem is None) == (parsed is not None)


def test_tool_error_messages_name_the_call_and_quote_the_arguments() -> None:
    message = {
        "role": "assistant",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ok", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "search", "arguments": '{"q": "x'}},
        ],
    }
    errors = tool_error_messages(message)
    assert len(errors) == 1
    assert errors[0]["role"] == "tool" and errors[0]["tool_call_id"] == "c2"
    assert "'search'" in errors[0]["content"] and '{"q": "x' in errors[0]["content"]
    assert tool_error_messages({"role": "assistant", "content": "hi"}) == []


def _chat_response(ids: list[int], lps: list[float], completion_tokens: int | None = None) -> dict:
    return {
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ab"},
                "logprobs": {"content": [{"logprob": v} for v in lps]},
                "token_ids": ids,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": len(ids) if completion_tokens is None else completion_tokens,
        },
    }


@pytest.mark.parametrize(
    ("ids", "lps", "completion_tokens", "flag"),
    [
        ([5, 6], [-0.1, -0.2], None, None),
        ([5, 6], [-0.1], None, "logprob_count_mismatch"),
        ([5, 6], [-0.1, -0.2], 3, "token_ids_missing"),
        ([5, 6], [-0.1, -0.2], 1, "token_count_mismatch"),
    ],
)
def test_consistency_flags_decide_trainable(
    ids: list[int], lps: list[float], completion_tokens: int | None, flag: str | None
) -> None:
    call = llm_call_from_response(
        _chat_response(ids, lps, completion_tokens),
        endpoint="chat",
        request={},
        model="policy",
        version="policy@v1",
    )
    assert call.completion_token_ids == ids and call.logprobs == lps
    assert call.trainable is (flag is None)
    assert call.flags == ([] if flag is None else [flag])


def test_missing_token_ids_are_flagged_not_rebuilt() -> None:
    data = _chat_response([5], [-0.1])
    del data["prompt_token_ids"], data["choices"][0]["token_ids"]
    call = llm_call_from_response(data, endpoint="chat", request={}, model="m", version="m")
    assert call.prompt_token_ids is None and call.completion_token_ids is None
    assert not call.trainable and "no_token_ids" in call.flags


class _Id(int):
    """An int subclass: not a plain id."""


@pytest.mark.parametrize(
    "bad", [[5, True], [5, 1.0], [5, "6"], [5, None], [5, [6]], [5, _Id(6)], [5, float("nan")], (5, 6), "5"]
)
def test_ids_that_are_not_all_plain_ints_are_not_taken(bad: object) -> None:
    """A bool, float, string, null, nested list or int subclass among the ids (or ids that are no list):
    the ids are missing, never coerced (the model's lax ``list[int]`` would read True and 1.0 as 1)."""
    data = _chat_response([5], [-0.1])
    data["prompt_token_ids"], data["choices"][0]["token_ids"] = bad, bad
    call = llm_call_from_response(data, endpoint="chat", request={}, model="m", version="m")
    assert call.prompt_token_ids is None and call.completion_token_ids is None
    assert not call.trainable and "no_token_ids" in call.flags


def test_ids_are_taken_exactly_at_any_size_and_length() -> None:
    """Ints beyond 64 bits and negative ones are ids as they are; a 4,000-id prompt is kept whole, as a copy
    the engine's answer does not share, and the record validates as its own model."""
    prompt = [*range(4000), 2**64, -(2**70), -1, 0]
    data = _chat_response([2**63, 7], [-0.1, -0.2])
    data["prompt_token_ids"] = prompt
    call = llm_call_from_response(data, endpoint="chat", request={}, model="m", version="m")
    assert call.prompt_token_ids == prompt and call.prompt_token_ids is not prompt
    assert call.completion_token_ids == [2**63, 7]
    assert all(type(i) is int for i in call.prompt_token_ids + call.completion_token_ids)
    assert {"prompt_token_ids", "completion_token_ids"} <= call.model_fields_set
    assert type(call).model_validate(call.model_dump()) == call


def test_stream_capture_folds_chunks_like_the_unary_answer() -> None:
    unary = {
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hi",
                    "tool_calls": [
                        {"id": "t", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
                    ],
                },
                "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}, {"logprob": -3.0}]},
                "token_ids": [7, 8, 9],
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 2,
            "completion_tokens": 3,
            "total_tokens": 5,
            "prompt_tokens_details": None,
        },
    }
    chunks = [
        {
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            "prompt_token_ids": [1, 2],
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "Hi"},
                    "token_ids": [7],
                    "logprobs": {"content": [{"logprob": -1.0}]},
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "t", "function": {"name": "f", "arguments": '{"a"'}}
                        ]
                    },
                    "token_ids": [8],
                    "logprobs": {"content": [{"logprob": -2.0}]},
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},
                    "token_ids": [9],
                    "logprobs": {"content": [{"logprob": -3.0}]},
                    "finish_reason": "tool_calls",
                }
            ]
        },
        {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}},
    ]
    capture = StreamCapture("chat")
    finished = [capture.feed(c) for c in chunks]
    assert finished == [False, False, False, True, False]
    kw = {"endpoint": "chat", "request": {}, "model": "p", "version": "p@v1"}
    a = llm_call_from_response(unary, **kw)
    b = llm_call_from_response(capture.response(), stream=True, **kw)
    assert a.model_dump(exclude={"stream"}) == b.model_dump(exclude={"stream"})
    assert b.tool_calls[0].parsed == {"a": 1} and b.trainable


def test_upstream_body_asks_for_ids_and_usage_without_touching_the_client_body() -> None:
    body = {
        "model": "policy",
        "messages": [],
        "stream": True,
        "stream_options": {"continuous_usage_stats": False},
    }
    sent = upstream_body(body, "chat", Upstream("http://x/v1", "policy@v1"))
    assert sent["model"] == "policy@v1" and sent["logprobs"] is True and sent["return_token_ids"] is True
    assert sent["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert body["model"] == "policy" and "logprobs" not in body
    completions = upstream_body({"model": "p", "prompt": "x"}, "completions", Upstream("http://x/v1", "m"))
    assert completions["logprobs"] == 0
    hosted = upstream_body(
        {"model": "p", "messages": []}, "chat", Upstream("https://api/v1", "gpt", token_ids=False)
    )
    assert hosted == {"model": "gpt", "messages": []}


def test_shaping_returns_only_what_the_client_asked_for() -> None:
    data = _chat_response([5, 6], [-0.1, -0.2])
    plain = shape_response(data, client_ask({"messages": []}, "chat"), "policy@v1")
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    assert plain["choices"][0]["logprobs"] is None and plain["model"] == "policy@v1"
    full = shape_response(data, client_ask({"logprobs": True, "return_token_ids": True}, "chat"), "v")
    assert (
        full["prompt_token_ids"] == [1, 2, 3]
        and full["choices"][0]["logprobs"] == data["choices"][0]["logprobs"]
    )
    ask = ClientAsk(logprobs=False, token_ids=False, usage_chunk=False, stream=True)
    assert shape_chunk({"choices": [], "usage": {"completion_tokens": 2}}, ask, "v") is None


def test_upstream_error_bodies_are_normalised() -> None:
    vllm = json.dumps(
        {"error": {"message": "too long", "type": "BadRequestError", "param": "input_tokens", "code": 400}}
    )
    assert upstream_error_body(400, vllm.encode())["error"]["message"] == "too long"
    html = upstream_error_body(502, b"<html>bad gateway</html>")["error"]
    assert "502" in html["message"] and "bad gateway" in html["message"]
