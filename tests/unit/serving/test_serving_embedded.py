"""The embedded transformers + peft backend: the PolicyServer protocol and vLLM-shaped responses."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from adapters import LETTER_MESSAGES, rank_adapter
from serving_helpers import FEW_SHOT, WEATHER_TOOL, ask_letter, llm_spans, new_rollout

from agentforge.errors import AdapterIncompatibleError, NotFoundError, UserError
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.serving.base import PolicyServer
from agentforge.serving.embedded import EmbeddedServer
from agentforge.serving.hotswap import ChatCanary, HotSwapper

pytest.importorskip("peft")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def embedded(letter_adapters: dict[str, Path]) -> Iterator[EmbeddedServer]:
    server = EmbeddedServer()
    server.start()
    server.load_adapter("emb@v1", letter_adapters["A"])
    server.load_adapter("emb@v2", letter_adapters["B"])
    yield server
    server.stop()


def chat(server: EmbeddedServer, **body: object) -> dict:
    body = {
        "model": "emb@v1",
        "messages": LETTER_MESSAGES,
        "temperature": 0,
        "max_tokens": 8,
        "logprobs": True,
        "return_token_ids": True,
        **body,
    }
    response = httpx.post(
        f"{server.base_url}/chat/completions", json=body, headers=server.auth_headers(), timeout=60
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_protocol_and_two_adapters(embedded: EmbeddedServer) -> None:
    assert isinstance(embedded, PolicyServer)
    assert embedded.adapters() == ["emb@v1", "emb@v2"]
    key = embedded.api_key
    assert ask_letter(embedded.base_url, "emb@v1", api_key=key) == "A"
    assert ask_letter(embedded.base_url, "emb@v2", api_key=key) == "B"
    assert ask_letter(embedded.base_url, "base", api_key=key) not in ("A", "B")
    cards = httpx.get(f"{embedded.base_url}/models", headers=embedded.auth_headers()).json()["data"]
    assert [(c["id"], c["parent"]) for c in cards] == [("base", None), ("emb@v1", "base"), ("emb@v2", "base")]
    with pytest.raises(UserError, match="new name"):
        embedded.load_adapter("emb@v1", rank_adapter(8))
    with pytest.raises(AdapterIncompatibleError, match="--max-lora-rank 32"):
        embedded.load_adapter("emb@v3", rank_adapter(32))
    with pytest.raises(NotFoundError):
        embedded.unload_adapter("emb@v9")
    missing = httpx.post(
        f"{embedded.base_url}/chat/completions",
        json={"model": "nope", "messages": LETTER_MESSAGES},
        headers=embedded.auth_headers(),
    )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404


def test_messages_the_chat_template_cannot_render_are_a_400(embedded: EmbeddedServer) -> None:
    """A message without ``role`` makes the chat template raise jinja2's ``UndefinedError``: the engine
    answers 400 with the reason, as vLLM does, not a 500 (the gateway refuses such a body itself; a client
    may call the engine directly)."""
    root = embedded.base_url.removesuffix("/v1")
    for path, body in (
        ("/v1/chat/completions", {"model": "base", "messages": [{"content": "hi"}], "max_tokens": 2}),
        ("/tokenize", {"messages": [{"content": "hi"}]}),
    ):
        r = httpx.post(f"{root}{path}", json=body, headers=embedded.auth_headers(), timeout=60)
        assert r.status_code == 400 and "cannot render" in r.text and "role" in r.text, (path, r.text)


def test_token_ids_and_logprobs_consistent(embedded: EmbeddedServer) -> None:
    from transformers import AutoTokenizer

    out = chat(embedded)
    choice = out["choices"][0]
    tokenizer = AutoTokenizer.from_pretrained(embedded.base_model)
    prompt = tokenizer.apply_chat_template(LETTER_MESSAGES, add_generation_prompt=True, tokenize=False)
    assert out["prompt_token_ids"] == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert choice["token_ids"] == [tokenizer.convert_tokens_to_ids("A"), tokenizer.eos_token_id]
    entries = choice["logprobs"]["content"]
    assert [e["token"] for e in entries] == ["A", "<|im_end|>"]
    assert len(entries) == len(choice["token_ids"]) and all(e["logprob"] <= 0 for e in entries)
    assert out["usage"] == {
        "prompt_tokens": len(out["prompt_token_ids"]),
        "completion_tokens": 2,
        "total_tokens": len(out["prompt_token_ids"]) + 2,
    }
    assert choice["finish_reason"] == "stop"

    stream = httpx.post(
        f"{embedded.base_url}/chat/completions",
        headers=embedded.auth_headers(),
        timeout=60,
        json={
            "model": "emb@v1",
            "messages": LETTER_MESSAGES,
            "temperature": 0,
            "max_tokens": 8,
            "logprobs": True,
            "return_token_ids": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    chunks = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: {")]
    assert chunks[0]["prompt_token_ids"] == out["prompt_token_ids"]
    assert [t for c in chunks if c["choices"] for t in c["choices"][0].get("token_ids") or []] == choice[
        "token_ids"
    ]
    streamed_lp = [
        e["logprob"]
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert streamed_lp == [e["logprob"] for e in entries]
    assert chunks[-1]["usage"]["completion_tokens"] == 2


def test_sampling_seed_and_completions(embedded: EmbeddedServer) -> None:
    body = {
        "model": "base",
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "temperature": 1.0,
        "max_tokens": 12,
        "seed": 7,
    }
    first, second = chat(embedded, **body), chat(embedded, **body)
    assert first["choices"][0]["token_ids"] == second["choices"][0]["token_ids"]
    assert (
        chat(embedded, **{**body, "seed": 8})["choices"][0]["token_ids"] != first["choices"][0]["token_ids"]
    )
    assert len(first["choices"][0]["token_ids"]) <= 12
    out = httpx.post(
        f"{embedded.base_url}/completions",
        headers=embedded.auth_headers(),
        timeout=60,
        json={
            "model": "base",
            "prompt": "The capital of France is",
            "temperature": 0,
            "max_tokens": 3,
            "logprobs": 1,
            "return_token_ids": True,
        },
    ).json()["choices"][0]
    assert out["text"].startswith(" Paris") and out["finish_reason"] == "length"
    assert len(out["token_ids"]) == len(out["logprobs"]["token_logprobs"]) == 3 and out["prompt_token_ids"]
    assert all(math.isfinite(lp) for lp in out["logprobs"]["token_logprobs"])


def test_tool_calls_parse(embedded: EmbeddedServer) -> None:
    messages = [*FEW_SHOT, {"role": "user", "content": "What is the weather in Paris?"}]
    out = chat(embedded, model="base", messages=messages, tools=[WEATHER_TOOL], max_tokens=40)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}


def test_hot_swap_through_gateway(
    letter_adapters: dict[str, Path],
    embedded: EmbeddedServer,
    serving_router: ModelRouter,
    serving_gateway: GatewayServer,
) -> None:
    swapper = HotSwapper(embedded, serving_router, "emb-policy")
    swapper.register_base()
    v1 = swapper.swap(letter_adapters["A"], canary=ChatCanary(LETTER_MESSAGES, expect=lambda t: t == "A"))
    rollout = new_rollout(serving_gateway)
    url = f"{serving_gateway.url}/rollouts/{rollout}/v1"
    assert ask_letter(url, "emb-policy") == "A"
    v2 = swapper.swap(letter_adapters["B"], canary=ChatCanary(LETTER_MESSAGES, expect=lambda t: t == "B"))
    assert ask_letter(url, "emb-policy") == "B"
    assert [s.llm.version for s in llm_spans(serving_gateway, rollout)] == [v1, v2]
    assert swapper.wait_drained(10) and not swapper.errors
    assert v1 not in embedded.adapters() and v2 in embedded.adapters()
    embedded.unload_adapter(v2)


def test_reset_to_base_drains_the_adapter_version(embedded, letter_adapters) -> None:
    from agentforge.gateway.router import ModelRouter
    from agentforge.serving.hotswap import HotSwapper

    router = ModelRouter()
    swapper = HotSwapper(embedded, router, alias="reset-test")
    version = swapper.swap(letter_adapters["C"])
    assert router.alias("reset-test") == version
    assert swapper.reset_to_base() == "reset-test@v0"
    assert router.alias("reset-test") == "reset-test@v0"
    assert swapper.wait_drained(timeout_s=30)
    assert version not in swapper.live_versions() and version not in embedded.adapters()
