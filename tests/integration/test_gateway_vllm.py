"""The gateway in front of a real vLLM (``AGENTFORGE_TEST_VLLM_URL``): ids are the engine's, exactly."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from agentforge.gateway import GatewayServer
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.stores.sql import SQLStore
from agentforge.testing import memory_store
from agentforge.types import Rollout

pytestmark = pytest.mark.vllm

MESSAGES = [{"role": "user", "content": "Name a colour."}]
SAMPLING = {"max_tokens": 8, "temperature": 0.0, "seed": 7}


@pytest.fixture
def vllm_gateway(
    vllm_server, vllm_base_url: str, vllm_model: str
) -> Iterator[tuple[GatewayServer, SQLStore, str]]:
    store = memory_store()
    router = ModelRouter()
    router.register("policy@base", Upstream(vllm_base_url, vllm_model, api_key=vllm_server.api_key))
    router.set_alias("policy", "policy@base")
    rollout_id = store.enqueue_rollout(Rollout()).rollout_id
    with GatewayServer(store, router, timeout_s=120) as server:
        yield server, store, rollout_id
    store.close()


def test_stored_ids_are_the_engines(vllm_gateway, vllm_server, vllm_base_url, vllm_model) -> None:
    server, store, rid = vllm_gateway
    direct = httpx.post(
        f"{vllm_base_url}/chat/completions",
        headers=vllm_server.auth_headers(),
        json={
            "model": vllm_model,
            "messages": MESSAGES,
            "logprobs": True,
            "return_token_ids": True,
            **SAMPLING,
        },
        timeout=120,
    ).json()
    client = openai.OpenAI(base_url=server.rollout_base_url(rid), api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model="policy", messages=MESSAGES, logprobs=True, extra_body={"return_token_ids": True}, **SAMPLING
    )
    (span,) = store.list_spans(rollout_id=rid)
    llm = span.llm
    assert (
        llm.completion_token_ids
        == reply.choices[0].model_extra["token_ids"]
        == direct["choices"][0]["token_ids"]
    )
    assert llm.prompt_token_ids == reply.model_extra["prompt_token_ids"] == direct["prompt_token_ids"]
    assert len(llm.logprobs) == len(llm.completion_token_ids) == llm.usage["completion_tokens"]
    assert llm.logprobs == [t.logprob for t in reply.choices[0].logprobs.content]
    assert llm.trainable and llm.flags == [] and llm.version == "policy@base"


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_stream_records_the_same_ids_as_unary(vllm_gateway, endpoint) -> None:
    server, store, rid = vllm_gateway
    client = openai.OpenAI(base_url=server.rollout_base_url(rid), api_key="unused", max_retries=0)
    if endpoint == "chat":
        client.chat.completions.create(model="policy", messages=MESSAGES, **SAMPLING)
        text = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model="policy", messages=MESSAGES, stream=True, **SAMPLING
            )
            if c.choices
        )
    else:
        client.completions.create(model="policy", prompt="The sky is", **SAMPLING)
        text = "".join(
            c.choices[0].text
            for c in client.completions.create(model="policy", prompt="The sky is", stream=True, **SAMPLING)
        )
    a, b = store.list_spans(rollout_id=rid)
    assert (a.llm.stream, b.llm.stream) == (False, True)
    for field in (
        "prompt_token_ids",
        "completion_token_ids",
        "logprobs",
        "usage",
        "finish_reason",
        "response_text",
    ):
        assert getattr(a.llm, field) == getattr(b.llm, field), field
    assert b.llm.response_text == text and b.llm.trainable
    assert len(b.llm.logprobs) == len(b.llm.completion_token_ids) > 0


def test_prompt_over_the_context_limit_is_a_clear_error_and_a_failed_span(vllm_gateway) -> None:
    server, store, rid = vllm_gateway
    client = openai.OpenAI(base_url=server.rollout_base_url(rid), api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hello " * 2100}], max_tokens=2
        )
    (span,) = store.list_spans(rollout_id=rid)
    assert span.status == "error" and "maximum context length" in span.error
    assert span.attributes["http_status"] == 400 and not span.llm.trainable
