"""The stream relay's fast path for plain token chunks (StreamCapture.feed_token + shape_token_chunk) captures
and forwards exactly what its general path (tool-call repair, StreamCapture.feed, shape_chunk) does, for any
chunk shape; and a stream's last events reach the client together with ``[DONE]``, after the span is stored."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from fuzzing import FUZZ
from gateway_helpers import CHAT, parse_sse
from hypothesis import given
from hypothesis import strategies as st

from agentforge.gateway.call import CallContext
from agentforge.gateway.stream import StreamRelay
from agentforge.gateway.upstream import UpstreamResponse
from agentforge.gateway.wire import ClientAsk
from agentforge.stores.sql import SQLStore

_ABSENT = object()


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(_ABSENT), st.none(), strategy)


_ids = st.one_of(
    st.lists(st.integers(min_value=0, max_value=50_000), max_size=3),
    st.just([True]),
    st.just(["7"]),
    st.just(7),
)
_logprobs = st.one_of(
    st.fixed_dictionaries(
        {"content": st.lists(st.fixed_dictionaries({"logprob": st.floats(-5, 0)}), max_size=2)}
    ),
    st.fixed_dictionaries({"token_logprobs": st.lists(st.one_of(st.none(), st.floats(-5, 0)), max_size=2)}),
    st.just({"content": "x"}),
    st.just("x"),
)
_tool_calls = st.lists(
    st.fixed_dictionaries(
        {"index": st.integers(0, 1)},
        optional={
            "id": st.sampled_from(["call_a", "call_b"]),
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {},
                optional={"name": st.sampled_from(["f", "g"]), "arguments": st.sampled_from(["", "{", "}"])},
            ),
        },
    ),
    max_size=2,
)
_delta = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "content": st.one_of(st.none(), st.text(max_size=4), st.just(3)),
            "role": st.just("assistant"),
            "tool_calls": _tool_calls,
        },
    ),
    st.just("x"),
)


def _choice(endpoint: str) -> st.SearchStrategy[dict[str, Any]]:
    fields: dict[str, st.SearchStrategy[Any]] = {
        "index": st.sampled_from([0, 0, 0, 1, False]),
        "finish_reason": _maybe(st.sampled_from(["stop", "length"])),
        "token_ids": _maybe(_ids),
        "logprobs": _maybe(_logprobs),
        "prompt_token_ids": _maybe(st.just([1, 2, 3])),
    }
    if endpoint == "chat":
        fields["delta"] = st.one_of(st.just(_ABSENT), _delta)
    else:
        fields["text"] = _maybe(st.text(max_size=4))
    return st.fixed_dictionaries(fields).map(lambda c: {k: v for k, v in c.items() if v is not _ABSENT})


def _chunk(endpoint: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "id": st.sampled_from([_ABSENT, "c1", "c1", "c1", "c2"]),
            "model": st.sampled_from([_ABSENT, "base"]),
            "choices": st.one_of(st.lists(_choice(endpoint), max_size=2), st.just(_ABSENT), st.just("x")),
            "usage": _maybe(st.just({"prompt_tokens": 3, "completion_tokens": 1})),
            "prompt_token_ids": _maybe(st.just([1, 2, 3])),
            "error": st.sampled_from([_ABSENT, _ABSENT, _ABSENT, "x", {"message": "boom"}]),
        }
    ).map(lambda c: {k: v for k, v in c.items() if v is not _ABSENT})


def _token_chunk(endpoint: str) -> st.SearchStrategy[dict[str, Any]]:
    """A plain token's chunk as vLLM writes it (mostly), so that examples exercise the fast path."""
    text = st.text(max_size=4)
    choice = st.fixed_dictionaries(
        {
            "index": st.just(0),
            "delta" if endpoint == "chat" else "text": (
                st.fixed_dictionaries({"content": text}) if endpoint == "chat" else text
            ),
            "logprobs": _logprobs,
            "finish_reason": st.none(),
            "token_ids": _ids,
        }
    )
    return st.fixed_dictionaries(
        {
            "id": st.sampled_from(["c1", "c1", "c2"]),
            "model": st.just("base"),
            "choices": st.tuples(choice).map(list),
        }
    )


def _relay(endpoint: str, ask: ClientAsk) -> StreamRelay:
    ctx = CallContext(endpoint, {"model": "policy"}, "ro-1", None)  # type: ignore[arg-type]
    ctx.version = "policy@v1"
    return StreamRelay(None, ctx, UpstreamResponse(200), ask, lambda: None)  # type: ignore[arg-type]


def _general(relay: StreamRelay, payloads: list[bytes]) -> tuple[list[bytes], str | None]:
    """What the relay sends when every chunk takes the general path (the reference)."""
    out: list[bytes] = []
    for data in payloads:
        error = relay._relay(json.loads(data), True, out)
        if error is not None:
            return out, error
    return out, None


@FUZZ
@given(
    st.sampled_from(["chat", "completions"]).flatmap(
        lambda e: st.tuples(st.just(e), st.lists(_token_chunk(e) | _chunk(e), min_size=1, max_size=8))
    ),
    st.builds(ClientAsk, st.booleans(), st.booleans(), st.booleans(), st.just(True)),
)
def test_token_chunks_take_the_fast_path_and_match_the_general_one(
    case: tuple[str, list[dict[str, Any]]], ask: ClientAsk
) -> None:
    endpoint, chunks = case
    payloads = [json.dumps(c).encode() for c in chunks]
    fast, reference = _relay(endpoint, ask), _relay(endpoint, ask)
    out: list[bytes] = []
    finished, error = fast._relay_all(payloads, out, True)
    expected, expected_error = _general(reference, payloads)
    assert not finished
    assert error == expected_error
    assert out == expected  # byte for byte what the client receives
    assert fast.capture.response() == reference.capture.response()
    assert fast.capture.finished == reference.capture.finished
    assert fast.tools.repairs == reference.tools.repairs


def test_the_fast_path_takes_plain_token_chunks_only() -> None:
    relay = _relay("chat", ClientAsk(False, False, False, True))
    first = {"id": "c1", "model": "base", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    token = {
        "id": "c1",
        "model": "base",
        "choices": [
            {
                "index": 0,
                "delta": {"content": "Hi"},
                "logprobs": {"content": [{"token": "Hi", "logprob": -0.5}]},
                "finish_reason": None,
                "token_ids": [42],
            }
        ],
    }
    capture = relay.capture
    assert capture.feed_token(first) is None  # a new stream id: the general path records it
    capture.feed(first)
    assert capture.feed_token(copy.deepcopy(token)) is not None
    assert capture.response()["choices"][0]["token_ids"] == [42]
    assert capture.response()["choices"][0]["logprobs"] == {"content": [{"logprob": -0.5}]}
    for other in (
        {**token, "id": "c2"},
        {**token, "usage": {"completion_tokens": 1}},
        {**token, "prompt_token_ids": [1]},
        {**token, "choices": [{**token["choices"][0], "finish_reason": "stop"}]},
        {**token, "choices": [{**token["choices"][0], "delta": {"tool_calls": []}}]},
        {**token, "choices": [token["choices"][0], {**token["choices"][0], "index": 1}]},
    ):
        assert capture.feed_token(copy.deepcopy(other)) is None
    assert capture.response()["choices"][0]["token_ids"] == [42]  # nothing was added by a refusal


async def test_a_streams_last_events_and_done_are_sent_together_after_the_span_is_stored(
    make_gateway: Any, gw_store: SQLStore
) -> None:
    app, _ = make_gateway(["Hello there, how are you?"])
    body = json.dumps({**CHAT, "stream": True}).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    sent: list[dict[str, Any]] = []
    spans_at_end: list[int] = []
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays until the response ends
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            spans_at_end.append(len(gw_store.list_spans(orphans=True)))

    async with app.router.lifespan_context(app):
        await app(scope, receive, send)
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert [m.get("more_body", False) for m in bodies] == [True] * (len(bodies) - 1) + [False]
    last = bodies[-1]["body"]
    assert last.endswith(b"data: [DONE]\n\n") and b'"finish_reason":"stop"' in last
    assert spans_at_end == [1]  # committed before the client saw the end
    chunks = parse_sse(b"".join(m["body"] for m in bodies).decode())
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == (
        "Hello there, how are you?"
    )
