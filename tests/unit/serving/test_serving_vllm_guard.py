"""The key guard vLLM loads as middleware: which routes each key opens (on a stand-in ASGI app)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import httpx
import pytest

from agentforge.serving.vllm import guard_dir

INFERENCE, ADMIN = "i" * 32, "a" * 32


def load_guard() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "agentforge_vllm_guard", guard_dir() / "agentforge_vllm_guard.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def engine(scope, receive, send) -> None:  # stands in for vLLM's app: answers every route 200
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"reached"})


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> httpx.AsyncClient:
    monkeypatch.setenv("AGENTFORGE_VLLM_KEY", INFERENCE)
    monkeypatch.setenv("AGENTFORGE_VLLM_ADMIN_KEY", ADMIN)
    app = load_guard().KeyGuard(engine)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine")


ADMIN_ROUTES = [
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"),
    ("POST", "/adapters"),  # vLLM's SageMaker LoRA routes: outside vLLM's own --api-key check
    ("DELETE", "/adapters/policy@v1"),
    ("POST", "/invocations"),
    ("GET", "/metrics"),
    ("POST", "/v1/load_lora_adapter/"),
    ("POST", "//v1/load_lora_adapter"),
    ("POST", "/v1/chat/completions/../load_lora_adapter"),
    ("GET", "/v1/chat/completions"),  # a known path under another method is not an inference route
]


async def test_routes_and_keys(guarded: httpx.AsyncClient) -> None:
    async def status(method: str, path: str, key: str | None) -> int:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return (await guarded.request(method, path, headers=headers)).status_code

    assert await status("GET", "/health", None) == 200
    for method, path in [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/v1/models"),
    ]:
        assert [await status(method, path, k) for k in (None, "wrong", INFERENCE, ADMIN)] == [
            401,
            401,
            200,
            200,
        ]
    for method, path in ADMIN_ROUTES:
        assert [await status(method, path, k) for k in (None, INFERENCE, ADMIN)] == [401, 401, 200], path
    refused = await guarded.post("/v1/load_lora_adapter", headers={"Authorization": INFERENCE})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == 401
    assert (
        await guarded.post("/v1/load_lora_adapter", headers={"Authorization": f"bearer {ADMIN}"})
    ).text == "reached"


def test_refuses_to_start_without_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTFORGE_VLLM_KEY", INFERENCE)
    monkeypatch.setenv("AGENTFORGE_VLLM_ADMIN_KEY", "short")
    with pytest.raises(RuntimeError, match="AGENTFORGE_VLLM_ADMIN_KEY"):
        load_guard().KeyGuard(engine)
    monkeypatch.delenv("AGENTFORGE_VLLM_KEY")
    with pytest.raises(RuntimeError, match="AGENTFORGE_VLLM_KEY"):
        load_guard().KeyGuard(engine)


def test_guard_imports_only_the_standard_library() -> None:
    """It runs in vLLM's interpreter, where agentforge is not installed."""
    tree = (guard_dir() / "agentforge_vllm_guard.py").read_text()
    imports = {
        line.split()[1].split(".")[0] for line in tree.splitlines() if line.startswith(("import ", "from "))
    }
    assert imports <= set(sys.stdlib_module_names) | {"__future__"}, imports
