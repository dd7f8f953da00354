"""Tenant adapters across an engine's restart and a failed unload, through the real gateway, router, hot-swapper,
supervisor and TenantAdapters on a stand-in engine (``serving_helpers.ProcessEngine``: a real process group) that
answers like vLLM: only the adapters it holds (404 for others), only with its current key (new at each start, 401
otherwise), and an adapter name it holds already is refused (``UserError``, as ``VLLMServer.load_adapter``).

Each answer names the adapter that produced it, so an answer shows which weights served a call and its span which
version: after the engine is killed and restarted each tenant's calls succeed on its own version (before the fix
they went to names the new engine never loaded, under its old key); an eviction whose unload fails does not stop a
later load of that version (before the fix the eviction failed its call, and the later load met "already in use").
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from serving_helpers import ProcessEngine, wait_for

from agentforge.errors import ServingError, UserError
from agentforge.gateway.app import create_gateway
from agentforge.gateway.router import ModelRouter
from agentforge.serving.canary import CanaryResult
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.supervise import EngineSupervisor
from agentforge.serving.tenants import TenantAdapters
from agentforge.stores.sql import SQLStore
from agentforge.testing import ScriptedUpstream, memory_store
from agentforge.types import TENANT_HEADER, ResourceVersion

KEY = "tenant-restart-tests-gateway-key"
TENANTS = "abc"


class LoraEngine(ProcessEngine, httpx.AsyncBaseTransport):
    """The stand-in engine, also the gateway's upstream transport (see the module docstring). ``fail_unloads``:
    an unload fails with ``ServingError`` and the adapter stays loaded (vLLM timing out on it)."""

    def __init__(self) -> None:
        super().__init__(start_s=0.05)
        self.fail_unloads = False
        self._answers_by_model: dict[str, ScriptedUpstream] = {}

    def start(self) -> None:
        super().start()
        self.api_key = secrets.token_hex(16)  # as VLLMServer: new keys at each start

    def load_adapter(self, name: str, path: str) -> None:
        if name in self.loaded:
            raise UserError(f"adapter name {name!r} is already in use on {self.base_url}")
        super().load_adapter(name, path)

    def unload_adapter(self, name: str) -> None:
        if self.fail_unloads:
            raise ServingError("vLLM refused /unload_lora_adapter (500): timed out")
        super().unload_adapter(name)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not self.running:
            raise httpx.ConnectError("connection refused", request=request)
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return httpx.Response(401, json={"error": {"message": "Unauthorized", "code": 401}})
        model = json.loads(await request.aread())["model"]
        if model != self.base_model_name and model not in self.loaded:
            body = {
                "error": {
                    "message": f"The model `{model}` does not exist.",
                    "type": "NotFoundError",
                    "code": 404,
                }
            }
            return httpx.Response(404, json=body)
        if model not in self._answers_by_model:
            self._answers_by_model[model] = ScriptedUpstream([f"from {model}"], model=model, cycle=True)
        return await self._answers_by_model[model].transport().handle_async_request(request)


def ok_canary(upstream: Any) -> CanaryResult:
    return CanaryResult("ok", [1])


@pytest.fixture
def stack() -> Iterator[tuple[LoraEngine, ModelRouter, HotSwapper, TenantAdapters, SQLStore, Any]]:
    """A started engine serving the base model as ``policy``, tenants a, b, c with a lineage each, and the gateway."""
    store = memory_store()
    for tenant in TENANTS:
        store.publish_resource(
            ResourceVersion(name=f"policy@{tenant}", kind="adapter", payload={"path": f"/ad/{tenant}"})
        )
    engine = LoraEngine()
    engine.start()
    router = ModelRouter()
    swapper = HotSwapper(engine, router, canary=ok_canary)
    swapper.register_base()
    adapters = TenantAdapters(engine, router, store, max_loaded=3)  # type: ignore[arg-type]
    app = create_gateway(store, router, KEY, transport=engine, tenant_models=adapters, tenant_header=True)
    yield engine, router, swapper, adapters, store, app
    engine.stop()
    store.close()


@pytest.fixture
async def client(stack: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=stack[-1])
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", headers=headers) as client:
        yield client


async def _ask(client: httpx.AsyncClient, tenant: str) -> tuple[int, str]:
    """One call of ``tenant`` for ``policy``: ``(status, answer text or error body)``."""
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    r = await client.post("/v1/chat/completions", json=body, headers={TENANT_HEADER: tenant})
    return r.status_code, r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text


def _own_spans(store: SQLStore, after: int) -> list[tuple[str | None, str]]:
    """``(tenant, version)`` of each LLM span after the first ``after`` ones, every one of them ok."""
    spans = [s for s in store.list_spans() if s.llm is not None][after:]
    assert all(s.status == "ok" for s in spans), [(s.tenant, s.status) for s in spans]
    return [(s.tenant, s.llm.version) for s in spans]  # type: ignore[union-attr]


async def test_after_an_engine_restart_each_tenant_is_served_its_own_version(
    stack: Any, client: httpx.AsyncClient
) -> None:
    engine, router, swapper, adapters, store, _ = stack
    assert [await _ask(client, t) for t in TENANTS] == [(200, f"from policy@{t}/v1") for t in TENANTS]
    assert sorted(engine.loaded) == [f"policy@{t}/v1" for t in TENANTS]
    before = len(store.list_spans())
    with EngineSupervisor(engine, swapper, poll_s=0.05, on_stopped=adapters.engine_lost) as supervisor:
        engine.kill()
        wait_for(lambda: supervisor.restarts == 1 and supervisor.state == "up", 10, "the restart")
        assert engine.starts == 2 and engine.loaded == [] and adapters.loaded() == []
        answers = [(t, await _ask(client, t)) for t in TENANTS * 3]
    assert answers == [
        (t, (200, f"from policy@{t}/v1")) for t in TENANTS * 3
    ]  # 0 failed, each its own weights
    assert _own_spans(store, before) == [(t, f"policy@{t}/v1") for t in TENANTS * 3]
    assert sorted(engine.loaded) == sorted(adapters.loaded()) == [f"policy@{t}/v1" for t in TENANTS]
    assert router.resolve("policy@a/v1")[1].api_key == engine.api_key  # registered again with the new key
    metrics = adapters.metrics()
    assert (metrics["tenants/loads"], metrics["tenants/cold_starts"]) == (6.0, 6.0)  # 3 before, 3 after


async def test_a_version_whose_unload_failed_loads_again(stack: Any, client: httpx.AsyncClient) -> None:
    engine, router, _, adapters, store, _ = stack
    adapters.max_loaded = 1
    assert await _ask(client, "a") == (200, "from policy@a/v1")
    engine.fail_unloads = True  # evicting a for b fails: a stays in the engine, out of service here
    assert await _ask(client, "b") == (200, "from policy@b/v1")
    assert adapters.loaded() == ["policy@b/v1"] and engine.loaded == ["policy@a/v1", "policy@b/v1"]
    assert "policy@a/v1" not in router.models()
    engine.fail_unloads = False
    assert await _ask(client, "a") == (200, "from policy@a/v1")  # the engine's "already in use": loaded
    assert await _ask(client, "a") == (200, "from policy@a/v1")
    assert adapters.loaded() == engine.loaded == ["policy@a/v1"]
    assert _own_spans(store, 0) == [
        ("a", "policy@a/v1"),
        ("b", "policy@b/v1"),
        ("a", "policy@a/v1"),
        ("a", "policy@a/v1"),
    ]
    assert adapters.metrics()["tenants/evictions"] == 2.0


def test_a_name_the_engine_refuses_and_does_not_hold_still_fails(stack: Any) -> None:
    engine, _, _, adapters, _, _ = stack

    def refuse(name: str, path: str) -> None:
        raise UserError(f"adapter name {name!r} is the base model's name")

    engine.load_adapter = refuse
    with pytest.raises(UserError, match="base model's name"):
        adapters.acquire("a", "policy")
    assert adapters.loaded() == [] and engine.loaded == []
