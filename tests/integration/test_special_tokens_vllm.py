"""Issue 15, item 2 on the real vLLM: one BOS in every prompt vLLM records, chat and text paths alike.

Guards against a doubled BOS inside the engine: a chat call and its tool round (sent by the gateway as token
ids, :mod:`agentforge.gateway.prefix`), and a text prompt rendered by the chat template and sent to
``/v1/completions`` (where vLLM tokenises with ``add_special_tokens=True``), each record a prompt that starts
with exactly one BOS and that the sample builder accepts; the closing EOS of each answer is sampled (mask 1).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from transformers import AutoTokenizer

from agentforge.config import default_model_dir
from agentforge.gateway import GatewayServer
from agentforge.gateway.prefix import CONTINUED
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.serving.vllm import default_chat_template
from agentforge.testing import memory_store
from agentforge.trainers.samples import build_trajectories
from agentforge.types import Rollout, RolloutState, SpanKind

pytestmark = pytest.mark.vllm

SAMPLING = {"max_tokens": 16, "temperature": 1.0, "seed": 3}


@pytest.fixture
def gateway(vllm_server, vllm_base_url: str, vllm_model: str) -> Iterator[tuple[GatewayServer, object]]:
    store = memory_store()
    router = ModelRouter()
    router.register(  # as serving registers it (HotSwapper): follow-up chat calls go to vLLM as ids
        "policy@base", Upstream(vllm_base_url, vllm_model, api_key=vllm_server.api_key, token_in=True)
    )
    router.set_alias("policy", "policy@base")
    with GatewayServer(store, router, timeout_s=180) as server:
        yield server, store
    store.close()


def _rollout(store) -> str:  # type: ignore[no-untyped-def]
    rollout_id = store.enqueue_rollout(Rollout()).rollout_id
    store.update_rollout(rollout_id, state=RolloutState.running)
    return rollout_id


def test_vllm_records_one_bos_on_chat_tool_round_and_text_paths(gateway) -> None:
    server, store = gateway
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    chat = _rollout(store)
    messages: list[dict] = [{"role": "user", "content": "What is 2 + 2? Answer in one word."}]
    for _ in range(2):  # a user message, then a tool round
        reply = httpx.post(
            f"{server.rollout_base_url(chat)}/chat/completions",
            json={"model": "policy", "messages": messages, **SAMPLING},
            timeout=300,
        )
        assert reply.status_code == 200, reply.text
        answer = reply.json()["choices"][0]["message"]["content"] or ""
        messages = [*messages, {"role": "assistant", "content": answer}, {"role": "tool", "content": "4"}]
    text = _rollout(store)
    served = default_chat_template(default_model_dir())  # the template the session's vLLM serves
    rendered = tokenizer.apply_chat_template(
        messages[:1],
        chat_template=served.read_text() if served else None,
        tokenize=False,
        add_generation_prompt=True,
    )
    reply = httpx.post(
        f"{server.rollout_base_url(text)}/completions",
        json={"model": "policy", "prompt": rendered, **SAMPLING},
        timeout=300,
    )
    assert reply.status_code == 200, reply.text

    spans = {rid: store.list_spans(rollout_id=rid, kind=SpanKind.llm) for rid in (chat, text)}
    for span in [*spans[chat], *spans[text]]:
        prompt = span.llm.prompt_token_ids
        assert prompt[0] == bos and prompt[1] != bos, tokenizer.decode(prompt[:8])
    first, second = sorted(spans[chat], key=lambda s: s.sequence)
    assert CONTINUED in second.llm.flags  # the tool round went to vLLM as ids, not re-rendered text
    assert spans[text][0].llm.prompt_token_ids == first.llm.prompt_token_ids  # text path: no extra BOS
    (trajectory,) = build_trajectories(spans[chat])  # accepted: no doubled start token; one trajectory
    for span in (first, second):
        if span.llm.finish_reason == "stop":
            assert span.llm.completion_token_ids[-1] == eos
    closing = [i for i, t in enumerate(trajectory.completion_ids) if t == eos and trajectory.env_mask[i]]
    assert len(closing) == sum(s.llm.finish_reason == "stop" for s in (first, second))
