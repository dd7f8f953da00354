"""The OpenAI Responses API at the gateway (issue 38): the official ``openai`` SDK's ``responses`` client, pointed
at the gateway by base URL only, against a scripted engine on the chat route: plain and streamed answers,
function calls and their outputs, ``previous_response_id`` conversations, the SDK's stream accumulator against the
plain answer and the span, errors as the SDK's typed exceptions.
"""

from __future__ import annotations

import openai
import pytest

from agentforge.gateway import GatewayServer
from agentforge.testing import ScriptedToolCall, ScriptedTurn, ScriptedUpstream, memory_store
from agentforge.types import Rollout

TURN = ScriptedTurn("It is noon in Paris.", logprobs=[-0.5, -0.25, -0.125, -0.0625, -0.03125])
TOOLS = [
    {
        "type": "function",
        "name": "get_time",
        "description": "The time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
CALL = ScriptedTurn(tool_calls=[ScriptedToolCall("get_time", '{"city": "Paris"}', id="call_7")])
FIELDS = ("prompt_token_ids", "completion_token_ids", "logprobs", "usage", "finish_reason", "response_text")


def _client(server: GatewayServer, rollout_id: str | None = None) -> openai.OpenAI:
    base = server.openai_base_url if rollout_id is None else server.rollout_base_url(rollout_id)
    return openai.OpenAI(base_url=base, api_key="unused", max_retries=0)


def test_a_plain_answer_and_its_span(served) -> None:
    server, upstream = served
    upstream.add(TURN)
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    response = _client(server, rid).responses.create(
        model="policy",
        instructions="Be brief.",
        input="What time is it?",
        max_output_tokens=64,
        temperature=0.5,
    )
    assert (
        response.output_text == TURN.text and response.status == "completed" and response.model == "policy@v1"
    )
    (sent,) = upstream.requests
    assert sent.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What time is it?"},
    ]
    assert (sent.body["max_tokens"], sent.body["temperature"]) == (64, 0.5)
    (span,) = server.store.list_spans(rollout_id=rid)
    assert (
        span.attributes["dialect"] == "responses"
        and span.llm.trainable
        and span.llm.logprobs == TURN.logprobs
    )
    assert response.usage.output_tokens == len(span.llm.completion_token_ids)


def test_a_function_call_then_its_output_by_previous_response_id(served) -> None:
    server, upstream = served
    upstream.add(CALL, TURN, TURN)
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    client = _client(server, rid)
    first = client.responses.create(
        model="policy", input="What time is it in Paris?", tools=TOOLS, tool_choice="required"
    )
    (call,) = first.output
    assert (call.type, call.call_id, call.name, call.arguments) == (
        "function_call",
        "call_7",
        "get_time",
        '{"city": "Paris"}',
    )
    assert upstream.requests[0].body["tool_choice"] == "required"
    assert upstream.requests[0].body["tools"][0]["function"]["parameters"] == TOOLS[0]["parameters"]
    output = [{"type": "function_call_output", "call_id": "call_7", "output": "12:00"}]
    second = client.responses.create(model="policy", previous_response_id=first.id, input=output, tools=TOOLS)
    assert second.output_text == TURN.text and second.previous_response_id == first.id
    history = upstream.requests[1].body["messages"]
    assert [m["role"] for m in history] == ["user", "assistant", "tool"]
    assert history[1]["tool_calls"][0]["id"] == "call_7" and history[2]["content"] == "12:00"
    # the same conversation sent whole (as the Agents SDK does) reaches the engine the same way
    items = [
        {"role": "user", "content": "What time is it in Paris?"},
        call.model_dump(exclude_none=True),
        *output,
    ]
    client.responses.create(model="policy", input=items, tools=TOOLS)
    assert upstream.requests[2].body["messages"] == history
    assert [s.attributes["dialect"] for s in server.store.list_spans(rollout_id=rid)] == ["responses"] * 3


@pytest.mark.parametrize("turn", [TURN, CALL], ids=["text", "function_call"])
def test_the_sdks_stream_accumulator_equals_the_plain_answer_and_the_span(served, turn) -> None:
    server, upstream = served
    upstream.add(turn, turn)
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    client = _client(server, rid)
    plain = client.responses.create(model="policy", input="What time is it?", tools=TOOLS)
    with client.responses.stream(model="policy", input="What time is it?", tools=TOOLS) as stream:
        kinds = [e.type for e in stream]
        streamed = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"

    def shape(r) -> list:
        return [
            (
                o.type,
                getattr(o, "name", None),
                getattr(o, "arguments", None),
                getattr(o, "call_id", None),
                [c.text for c in getattr(o, "content", [])],
            )
            for o in r.output
        ]

    assert shape(streamed) == shape(plain) and streamed.output_text == plain.output_text
    assert (streamed.status, streamed.usage.output_tokens) == (plain.status, plain.usage.output_tokens)
    a, b = server.store.list_spans(rollout_id=rid)
    assert (a.llm.stream, b.llm.stream) == (False, True)
    for field in FIELDS:
        assert getattr(a.llm, field) == getattr(b.llm, field), field
    upstream.add(TURN)  # a streamed response is remembered for previous_response_id too
    client.responses.create(model="policy", previous_response_id=streamed.id, input="thanks")
    assert [m["role"] for m in upstream.requests[-1].body["messages"]] == ["user", "assistant", "user"]


def test_errors_reach_the_sdk_as_its_own_typed_exceptions(served) -> None:
    server, upstream = served
    upstream.add(TURN)
    client = _client(server)
    with pytest.raises(openai.BadRequestError, match="hosted tools"):
        client.responses.create(model="policy", input="hi", tools=[{"type": "web_search"}])
    image = {"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}
    with pytest.raises(openai.BadRequestError, match="images are not supported"):
        client.responses.create(model="policy", input=[image])
    with pytest.raises(openai.NotFoundError, match="previous response"):
        client.responses.create(model="policy", previous_response_id="resp_nope", input="hi")
    unstored = client.responses.create(model="policy", input="hi", store=False)
    with pytest.raises(openai.NotFoundError, match="previous response"):
        client.responses.create(model="policy", previous_response_id=unstored.id, input="again")
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.responses.create(model="nope", input="hi")
    with pytest.raises(openai.InternalServerError, match="script exhausted"):  # the engine's 500
        client.responses.create(model="policy", input="hi")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"model": "policy", "input": "hi", "stream": True}),
        (
            "/v1/messages",
            {
                "model": "policy",
                "max_tokens": 16,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
        ),
    ],
    ids=["responses", "messages"],
)
def test_a_client_leaving_a_dialect_stream_is_recorded_and_releases_the_version(
    path: str, body: dict
) -> None:
    """The engine sends one event, then stalls: the client that hangs up is noticed, the call's span is recorded
    (client_disconnected) and the version's in-flight count released, as on the chat route."""
    import time

    import httpx

    store = memory_store()
    upstream = ScriptedUpstream([ScriptedTurn("a b c", chunk_delay_s=30)])
    with upstream.serve() as engine:
        router = upstream.router(base_url=f"{engine.url}/v1")
        with GatewayServer(store, router) as gateway:
            with httpx.Client(timeout=60) as client:  # a busy host may be slow to answer; the test hangs up
                with client.stream("POST", f"{gateway.url}{path}", json=body) as r:
                    assert r.status_code == 200
                    next(r.iter_lines())  # the first event arrived; now hang up
            left = time.monotonic()
            while not store.list_spans(orphans=True) and time.monotonic() < left + 25:
                time.sleep(0.02)
            (span,) = store.list_spans(orphans=True)
            assert time.monotonic() - left < 20 and router.inflight("policy@v1") == 0
    store.close()
    dialect = {"/v1/responses": "responses", "/v1/messages": "anthropic"}[path]
    assert span.attributes["client_disconnected"] is True and span.attributes["dialect"] == dialect


def test_a_turn_cut_by_max_output_tokens_is_incomplete_plain_and_streamed(served) -> None:
    server, upstream = served
    cut = ScriptedTurn("It is noon in", finish_reason="length")
    upstream.add(cut, cut)
    client = _client(server)
    plain = client.responses.create(model="policy", input="What time is it?", max_output_tokens=4)
    assert plain.status == "incomplete" and plain.incomplete_details.reason == "max_output_tokens"
    with client.responses.stream(model="policy", input="What time is it?", max_output_tokens=4) as stream:
        events = list(stream)
    assert (
        events[-1].type == "response.incomplete"
    )  # the API's own end of a cut stream (not response.completed)
    assert events[-1].response.output_text == plain.output_text == "It is noon in"
