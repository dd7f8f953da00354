"""Streams the client can always parse (issue 16): engines that bend OpenAI's tool-call delta format.

Each case streams through the gateway from an in-process engine; the client side is the OpenAI SDK's own
accumulator (``ChatCompletionStreamState``). The calls it ends with must equal the calls in the span,
every forwarded delta must be canonical (one opening fragment per call with id, type and name; then
arguments only), and the span must be flagged with what the gateway repaired.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from agentforge.gateway.app import create_gateway
from agentforge.gateway.router import ModelRouter, Upstream

CHAT = {"model": "policy", "messages": [{"role": "user", "content": "where is order 1?"}], "stream": True}


def chunk(delta: dict[str, Any], finish: str | None = None, ids: list[int] | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "base", "choices": [choice]}


def frag(index: int | None, id: str | None = None, name: str | None = None, args: str | None = None) -> dict:
    entry: dict[str, Any] = {} if index is None else {"index": index}
    if id is not None:
        entry["id"], entry["type"] = id, "function"
    function = {k: v for k, v in (("name", name), ("arguments", args)) if v is not None}
    if function:
        entry["function"] = function
    return entry


CASES = {
    # (a) the second call opens in the same chunk as the first call's last argument fragment
    "second-opens-beside-first": (
        [
            chunk({"role": "assistant", "tool_calls": [frag(0, "call_a", "get_order", "")]}, ids=[1]),
            chunk({"tool_calls": [frag(0, args='{"order_id": ')]}, ids=[2]),
            chunk({"tool_calls": [frag(0, args='"1"}'), frag(1, "call_b", "get_user", '{"u')]}, ids=[3]),
            chunk({"tool_calls": [frag(1, args='": 2}')]}, ids=[4]),
            chunk({}, "tool_calls", ids=[5]),
        ],
        [("call_a", "get_order", '{"order_id": "1"}'), ("call_b", "get_user", '{"u": 2}')],
        [],
    ),
    # (b) each call's id arrives only on its last fragment
    "id-on-last-fragment": (
        [
            chunk(
                {"role": "assistant", "tool_calls": [frag(0, None, "get_order", '{"order_id": ')]}, ids=[1]
            ),
            chunk({"tool_calls": [frag(0, "call_a", None, '"1"}')]}, ids=[2]),
            chunk({"tool_calls": [frag(1, None, "get_user", '{"u": 2')]}, ids=[3]),
            chunk({"tool_calls": [frag(1, "call_b", None, "}")]}, ids=[4]),
            chunk({}, "tool_calls", ids=[5]),
        ],
        [("call_a", "get_order", '{"order_id": "1"}'), ("call_b", "get_user", '{"u": 2}')],
        ["tool_call_id_late"],
    ),
    # the id, type and name repeated on every fragment (a client would build "call_acall_a")
    "id-and-name-on-every-fragment": (
        [
            chunk(
                {"role": "assistant", "tool_calls": [frag(0, "call_a", "get_order", '{"order_id": ')]},
                ids=[1],
            ),
            chunk({"tool_calls": [frag(0, "call_a", "get_order", '"1"}')]}, ids=[2]),
            chunk({}, "tool_calls", ids=[3]),
        ],
        [("call_a", "get_order", '{"order_id": "1"}')],
        ["tool_call_delta_repeated"],
    ),
    # no id at all and no index: the gateway numbers and names the call itself
    "no-id-no-index": (
        [
            chunk(
                {"role": "assistant", "tool_calls": [frag(None, None, "get_order", '{"order_id": ')]}, ids=[1]
            ),
            chunk({"tool_calls": [frag(None, args='"1"}')]}, ids=[2]),
            chunk({}, "tool_calls", ids=[3]),
        ],
        [(None, "get_order", '{"order_id": "1"}')],
        ["tool_call_index_missing", "tool_call_id_late", "tool_call_id_assigned"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_client_accumulates_exactly_the_calls_in_the_span(case: str, gw_store) -> None:
    chunks, expected, repairs = CASES[case]
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    engine = httpx.MockTransport(
        lambda request: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)
    )
    router = ModelRouter()
    router.register("policy@v1", Upstream("http://engine/v1", "base"))
    router.set_alias("policy", "policy@v1")
    app = create_gateway(gw_store, router, transport=engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        r = await client.post("/rollouts/ro-none/v1/chat/completions", json=CHAT)
    forwarded = [json.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")]
    state = ChatCompletionStreamState()
    for event in forwarded:
        state.handle_chunk(ChatCompletionChunk.model_validate(event))
    message = state.get_final_completion().choices[0].message
    client_calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]

    (span,) = gw_store.list_spans(orphans=True)
    assert span.llm is not None
    stored = [(c.id, c.name, c.arguments) for c in span.llm.tool_calls]
    assert client_calls == stored, "the client and the span disagree"
    for (call_id, name, arguments), (want_id, want_name, want_arguments) in zip(
        stored, expected, strict=True
    ):
        assert (name, arguments) == (want_name, want_arguments)
        assert (
            call_id == want_id if want_id is not None else call_id.startswith("call_") and len(call_id) == 29
        )
    assert [f for f in span.llm.flags if f.startswith("tool_call_")] == repairs
    assert span.llm.completion_token_ids == list(range(1, len(chunks) + 1)), "held fragments lost token ids"

    opened: set[int] = set()  # every forwarded delta is canonical
    for event in forwarded:
        for entry in (event["choices"][0].get("delta") or {}).get("tool_calls") or []:
            if entry["index"] not in opened:
                assert entry.get("id") and entry.get("type") == "function" and entry["function"].get("name")
                opened.add(entry["index"])
            else:
                assert set(entry) == {"index", "function"} and set(entry["function"]) == {"arguments"}
