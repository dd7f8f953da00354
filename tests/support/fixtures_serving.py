"""Fixtures for the serving component: one real vLLM server per test session, test adapters, the embedded
backend, and a gateway in front of a router.

``vllm_server`` starts ONE :class:`~agentforge.serving.vllm.VLLMServer` (default model, tool template) for
the whole session; tests load adapters into it under unique names rather than restarting it. Without the
vLLM virtual environment it skips, unless ``AGENTFORGE_REQUIRE_VLLM`` is set (CI, ``make test``): then it
fails. ``AGENTFORGE_TEST_VLLM_URL`` reuses a running server instead (dev speed; with its keys in
``AGENTFORGE_TEST_VLLM_KEY`` and ``AGENTFORGE_TEST_VLLM_ADMIN_KEY`` when agentforge started it); tests that
need the tool template (``vllm_tool_server``) skip when that server does not render tools. Requests straight
to the engine send ``vllm_server.auth_headers()``: every route but ``/health`` needs its key.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentforge.config import home_dir, vllm_python
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.model import prepare_default_model
from agentforge.serving.vllm import VLLMServer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VLLMServer]:
    """The session's vLLM server (started once, stopped at the end; or the one at AGENTFORGE_TEST_VLLM_URL)."""
    url = os.environ.get("AGENTFORGE_TEST_VLLM_URL")
    if url:
        yield VLLMServer.connect(
            url,
            api_key=os.environ.get("AGENTFORGE_TEST_VLLM_KEY"),
            admin_key=os.environ.get("AGENTFORGE_TEST_VLLM_ADMIN_KEY"),
        )
        return
    if vllm_python() is None:
        reason = "no vLLM virtual environment (.venv-vllm or AGENTFORGE_VLLM_PYTHON); run `make setup`"
        if os.environ.get("AGENTFORGE_REQUIRE_VLLM"):
            pytest.fail(f"AGENTFORGE_REQUIRE_VLLM is set but there is {reason}")
        pytest.skip(reason)
    server = VLLMServer(
        prepare_default_model(), log_path=home_dir() / "logs" / f"vllm-tests-{os.getpid()}.log"
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vllm_base_url(vllm_server: VLLMServer) -> str:
    """OpenAI base URL (``.../v1``) of the session's vLLM server."""
    return vllm_server.base_url


@pytest.fixture(scope="session")
def vllm_model(vllm_server: VLLMServer) -> str:
    """The name the session's vLLM server serves the base model under."""
    return vllm_server.base_model_name


def renders_tools(base_url: str, model: str, headers: dict[str, str] | None = None) -> bool:
    """Whether the server's chat template lists tool schemas (probed through ``/tokenize``)."""
    root = base_url.removesuffix("/v1")
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER_TOOL]}
    tokens = httpx.post(f"{root}/tokenize", json=body, headers=headers, timeout=30).json()["tokens"]
    detokenize = {"model": model, "tokens": tokens}
    text = httpx.post(f"{root}/detokenize", json=detokenize, headers=headers, timeout=30).json()["prompt"]
    return "get_weather" in text


@pytest.fixture(scope="session")
def vllm_tool_server(vllm_server: VLLMServer) -> VLLMServer:
    """The session's vLLM server, if it renders tools (a reused AGENTFORGE_TEST_VLLM_URL server may not)."""
    if not renders_tools(vllm_server.base_url, vllm_server.base_model_name, vllm_server.auth_headers()):
        pytest.skip("the vLLM server at AGENTFORGE_TEST_VLLM_URL has no tool chat template; unset it")
    return vllm_server


@pytest.fixture(scope="session")
def letter_adapters() -> dict[str, Path]:
    """Rank-8 adapters answering "A", "B", "C" to ``adapters.LETTER_MESSAGES`` (trained once, cached)."""
    from adapters import letter_adapter

    return {letter: letter_adapter(letter) for letter in "ABC"}


@pytest.fixture
def unique_alias() -> str:
    """A fresh alias (``policy-1a2b3c``) so versions loaded into the shared server never collide."""
    return f"policy-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def serving_router() -> ModelRouter:
    """An empty model router."""
    return ModelRouter()


@pytest.fixture
def serving_gateway(serving_router: ModelRouter) -> Iterator[GatewayServer]:
    """The real gateway (in-memory store at ``.store``) on a loopback port in front of ``serving_router``."""
    from agentforge.testing import memory_store

    store = memory_store()
    server = GatewayServer(store, serving_router)
    server.store = store  # type: ignore[attr-defined]
    with server:
        yield server
    store.close()


@pytest.fixture(scope="module")
def embedded_engine() -> Iterator[object]:
    """One started :class:`~agentforge.serving.embedded.EmbeddedServer` (default model) per test module."""
    from agentforge.serving.embedded import EmbeddedServer

    server = EmbeddedServer()
    server.start()
    yield server
    server.stop()
