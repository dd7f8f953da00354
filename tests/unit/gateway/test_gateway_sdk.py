"""OpenAI SDK clients (sync and async, streamed and not) against the gateway on a real port."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest
from gateway_helpers import CHAT, parse_sse

from agentforge.gateway import GatewayServer
from agentforge.stores.http import HTTPStore
from agentforge.testing import ScriptedToolCall, ScriptedTurn, ScriptedUpstream, memory_store
from agentforge.types import Reward, Rollout, Span

TURN = ScriptedTurn("It is noon in Paris.", logprobs=[-0.5, -0.25, -0.125, -0.0625, -0.03125])
FIELDS = ("prompt_token_ids", "completion_token_ids", "logprobs", "usage", "finish_reason", "response_text")


def _spans(server: GatewayServer, rollout_id: str):
    return server.store.list_spans(rollout_id=rollout_id)


def _rollout(server: GatewayServer) -> str:
    return server.store.enqueue_rollout(Rollout()).rollout_id


def test_sync_client_stream_and_unary_record_identical_spans(served) -> None:
    server, upstream = served
    upstream.add(TURN, TURN)
    rid = _rollout(server)
    client = openai.OpenAI(base_url=server.rollout_base_url(rid), api_key="unused", max_retries=0)
    unary = client.chat.completions.create(model="policy", messages=CHAT["messages"])
    chunks = list(
        client.chat.completions.create(
            model="policy", messages=CHAT["messages"], stream=True, stream_options={"include_usage": True}
        )
    )
    assert unary.choices[0].message.content == TURN.text
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TURN.text
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == unary.usage.completion_tokens
    )
    a, b = _spans(server, rid)
    assert (a.llm.stream, b.llm.stream) == (False, True)
    for field in FIELDS:
        assert getattr(a.llm, field) == getattr(b.llm, field), field
    assert a.llm.logprobs == TURN.logprobs and a.llm.completion_token_ids == TURN.completion_ids()


async def test_async_client_stream_and_unary_record_identical_spans(served) -> None:
    server, upstream = served
    upstream.add(TURN, TURN)
    rid = _rollout(server)
    client = openai.AsyncOpenAI(base_url=server.rollout_base_url(rid), api_key="unused", max_retries=0)
    unary = await client.chat.completions.create(model="policy", messages=CHAT["messages"], logprobs=True)
    stream = await client.chat.completions.create(model="policy", messages=CHAT["messages"], stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    await client.close()
    assert text == unary.choices[0].message.content == TURN.text
    assert [t.logprob for t in unary.choices[0].logprobs.content] == TURN.logprobs
    a, b = _spans(server, rid)
    for field in FIELDS:
        assert getattr(a.llm, field) == getattr(b.llm, field), field


def test_sdk_reads_token_ids_when_asked_and_streamed_tool_calls(served) -> None:
    server, upstream = served
    upstream.add(TURN, ScriptedTurn(tool_calls=[ScriptedToolCall("get_time", "")]))
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model="policy", messages=CHAT["messages"], extra_body={"return_token_ids": True}
    )
    assert reply.choices[0].model_extra["token_ids"] == TURN.completion_ids()
    assert reply.model_extra["prompt_token_ids"]
    calls: dict[int, str] = {}
    for chunk in client.chat.completions.create(model="policy", messages=CHAT["messages"], stream=True):
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            calls[call.index] = calls.get(call.index, "") + (call.function.arguments or "")
    assert calls == {0: "{}"}


def test_sdk_sees_upstream_errors_as_api_errors(served) -> None:
    server, _ = served  # empty script: the fake answers 500 "script exhausted"
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.InternalServerError, match="script exhausted"):
        client.chat.completions.create(model="policy", messages=CHAT["messages"])
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=CHAT["messages"])


def _leave_after_first_event(turn: ScriptedTurn) -> tuple[Span, int, float]:
    """Stream ``turn`` through a gateway, hang up after the first event; returns the recorded span, the
    version's in-flight count afterwards and the seconds from hanging up to the span being stored."""
    store = memory_store()
    upstream = ScriptedUpstream([turn])
    with upstream.serve() as up_server:
        router = upstream.router(base_url=f"{up_server.url}/v1")
        with GatewayServer(store, router) as gateway:
            with httpx.Client(timeout=60) as client:  # a busy host may be slow to answer; the test hangs up
                with client.stream(
                    "POST", f"{gateway.openai_base_url}/chat/completions", json={**CHAT, "stream": True}
                ) as r:
                    next(r.iter_lines())  # the first event arrived; now hang up
            left = time.monotonic()
            while not store.list_spans(orphans=True) and time.monotonic() < left + 25:
                time.sleep(0.02)
            waited = time.monotonic() - left
            (span,) = store.list_spans(orphans=True)
            inflight = router.inflight("policy@v1")
    store.close()
    return span, inflight, waited


def test_client_disconnect_mid_stream_releases_and_records() -> None:
    span, inflight, _ = _leave_after_first_event(
        ScriptedTurn("a b c d e f g h i j k l m n o p", chunk_delay_s=0.1)
    )
    assert span.status == "error" and span.attributes["client_disconnected"] is True
    assert span.llm is not None and not span.llm.trainable and inflight == 0
    assert "client_disconnected" in span.llm.flags and "upstream_error" not in span.llm.flags


def test_sse_from_the_gateway_is_well_formed(served) -> None:
    server, upstream = served
    upstream.add(TURN)
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    chunks = parse_sse(httpx.post(f"{server.openai_base_url}/chat/completions", json=body).text)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(
        TURN.completion_ids()
    )


def test_rewards_can_be_posted_to_the_gateway_port(served) -> None:
    server, upstream = served
    upstream.add(TURN)
    rid = _rollout(server)
    openai.OpenAI(
        base_url=server.rollout_base_url(rid), api_key="unused", max_retries=0
    ).chat.completions.create(model="policy", messages=CHAT["messages"])
    remote = HTTPStore(server.url)
    remote.add_reward(Reward(rollout_id=rid, value=0.7))
    (span,) = _spans(server, rid)
    reward = server.store.final_reward(rid)
    assert reward.value == pytest.approx(0.7) and reward.span_id == span.span_id
    remote.close()


@pytest.mark.parametrize("server", ["agentforge", "uvicorn"])
def test_client_leaving_a_stalled_stream_is_noticed_before_the_next_chunk(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine sends one event, then nothing for 30 s: the client that leaves is noticed at once (not at
    the next write), the span is recorded and the version released. Under the gateway's own server the
    protocol's disconnect hook tells the fast path (no watcher task per call); under uvicorn's own
    protocol a watcher task waits on ``receive()``."""
    from agentforge.gateway import fastpath
    from agentforge.gateway import server as server_module

    watchers: list[object] = []
    real = fastpath._cancel_on_disconnect

    def counted(receive: Any, task: Any) -> Any:
        watchers.append(task)
        return real(receive, task)

    monkeypatch.setattr(fastpath, "_cancel_on_disconnect", counted)
    if server == "uvicorn":
        monkeypatch.setattr(server_module, "_http_protocol", lambda *_: "httptools")
    span, inflight, waited = _leave_after_first_event(ScriptedTurn("a b c", chunk_delay_s=30))
    assert waited < 20  # noticed well before the engine's next chunk (30 s), not at the next write
    assert span.attributes["client_disconnected"] is True and inflight == 0
    assert bool(watchers) == (server == "uvicorn")
