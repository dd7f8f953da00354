"""``agentforge.testing``: the scripted upstream speaks vLLM's dialect; the memory store is a real store."""

from __future__ import annotations

import httpx
import pytest
from gateway_helpers import CHAT, parse_sse

from agentforge.stores.base import TraceStore
from agentforge.testing import ScriptedToolCall, ScriptedTurn, ScriptedUpstream, fake_token_ids, memory_store


@pytest.fixture
async def fake() -> ScriptedUpstream:
    return ScriptedUpstream()


async def _post(upstream: ScriptedUpstream, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=upstream.transport(), base_url="http://fake") as client:
        return await client.post(path, json=body)


async def test_ids_and_logprobs_only_when_asked(fake: ScriptedUpstream) -> None:
    fake.add("Hello world", "Hello world")
    plain = (await _post(fake, "/v1/chat/completions", {**CHAT, "model": "base"})).json()
    assert (
        "prompt_token_ids" not in plain
        and "token_ids" not in plain["choices"][0]
        and plain["choices"][0]["logprobs"] is None
    )
    full = (
        await _post(
            fake,
            "/v1/chat/completions",
            {**CHAT, "model": "base", "logprobs": True, "return_token_ids": True},
        )
    ).json()
    assert full["choices"][0]["token_ids"] == fake_token_ids("Hello world")
    assert len(full["choices"][0]["logprobs"]["content"]) == 3 and full["usage"]["completion_tokens"] == 3
    assert [r.body["model"] for r in fake.requests] == ["base", "base"] and fake.remaining == 0


async def test_stream_layout_matches_vllm(fake: ScriptedUpstream) -> None:
    fake.add(ScriptedTurn("Hi!", tool_calls=[ScriptedToolCall("f", '{"a": 1}')]))
    body = {
        **CHAT,
        "model": "base",
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    chunks = parse_sse((await _post(fake, "/v1/chat/completions", body)).text)
    assert (
        chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        and chunks[0]["prompt_token_ids"]
    )
    ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids") or []]
    assert ids == ScriptedTurn("Hi!", tool_calls=[ScriptedToolCall("f", '{"a": 1}')]).completion_ids()
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(ids)


async def test_completions_put_prompt_ids_in_the_first_choice(fake: ScriptedUpstream) -> None:
    fake.add("blue")
    body = {"model": "base", "prompt": "The sky is", "stream": True, "return_token_ids": True, "logprobs": 0}
    chunks = parse_sse((await _post(fake, "/v1/completions", body)).text)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == fake_token_ids("The sky is")
    assert chunks[0]["choices"][0]["logprobs"]["token_logprobs"] == [-0.01]


async def test_errors_like_vllm(fake: ScriptedUpstream) -> None:
    r = await _post(fake, "/v1/chat/completions", {**CHAT, "model": "other"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = await _post(fake, "/v1/chat/completions", {**CHAT, "model": "base"})
    assert r.status_code == 500 and "script exhausted" in r.json()["error"]["message"]


def test_memory_store_is_a_fresh_trace_store() -> None:
    a, b = memory_store(), memory_store()
    assert isinstance(a, TraceStore) and a.list_spans(orphans=True) == [] and a is not b
    a.close()
    b.close()
