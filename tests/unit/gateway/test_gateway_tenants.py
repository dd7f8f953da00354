"""Tenants at the gateway (in-process gateway, one scripted engine per tenant adapter, real SQLite store): a tenant
key's ``policy`` is its own lineage's live version and never another tenant's adapter (spans checked), it cannot
name or pin another tenant's version nor use its rollouts, and revocation works without a restart."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from gateway_helpers import ByHostTransport, tenant_router

from agentforge.gateway.app import create_gateway
from agentforge.gateway.router import ModelRouter
from agentforge.stores.sql import SQLStore
from agentforge.stores.tenants import TenantKeyCache
from agentforge.testing import ScriptedUpstream, memory_store
from agentforge.types import Rollout

GATEWAY_KEY = "tenant-tests-gateway-key"


@pytest.fixture
def engines() -> dict[str, ScriptedUpstream]:
    """``shared`` serves the base model; ``acme`` and ``bolt`` each serve only their tenant's adapter."""
    return {
        host: ScriptedUpstream([f"from {host}"], model=f"{host}-model", cycle=True)
        for host in ("shared", "acme", "bolt")
    }


@pytest.fixture
def store() -> AsyncIterator[SQLStore]:
    store = memory_store()
    yield store  # type: ignore[misc]
    store.close()


def _client(app: object, key: str, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {key}", **headers},
    )


async def _ask(
    client: httpx.AsyncClient, model: str = "policy", rollout: str | None = None
) -> httpx.Response:
    prefix = f"/rollouts/{rollout}" if rollout else ""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return await client.post(f"{prefix}/v1/chat/completions", json=body)


async def test_a_tenant_is_served_its_own_adapter_and_never_another_tenants(
    store: SQLStore, engines: dict[str, ScriptedUpstream]
) -> None:
    directory = TenantKeyCache(store.tenant_keys, cache_s=0)
    app = create_gateway(
        store,
        tenant_router(engines),
        GATEWAY_KEY,
        transport=ByHostTransport(engines),
        tenants=directory,
        tenant_header=True,
    )
    key_a, key_b, key_c = (store.tenant_keys.issue(t) for t in ("acme", "bolt", "carp"))
    ro_a = store.enqueue_rollout(Rollout(tenant="acme")).rollout_id
    ro_b = store.enqueue_rollout(Rollout(tenant="bolt")).rollout_id
    # a row written around the store API (which refuses it) pins acme's rollout to bolt's version
    ro_bad = store.enqueue_rollout(Rollout(tenant="acme", resources={"policy": "policy@bolt/v1"})).rollout_id
    async with _client(app, key_a) as a, _client(app, key_c) as c, _client(app, GATEWAY_KEY) as app_key:
        for _ in range(3):
            answer = await _ask(a, rollout=ro_a)
            assert answer.status_code == 200 and answer.json()["model"] == "policy@acme/v1"
        assert (await _ask(c)).json()["model"] == "policy@v1"  # carp has no lineage: the shared version
        assert (await _ask(a, "policy@bolt/v1")).status_code == 404  # cannot name bolt's version
        assert (await _ask(a, "policy@bolt")).status_code == 404
        assert (await _ask(a, rollout=ro_b)).status_code == 404  # nor use bolt's rollout
        assert (await _ask(a, rollout=ro_bad)).status_code == 404  # nor a pin to bolt's version
        refused = await a.post(
            "/v1/chat/completions",
            json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
            headers={"X-Tenant": "bolt"},
        )
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "tenant_refused"
        # the app's own key acts for a tenant through the header
        answer = await _ask(_client(app, GATEWAY_KEY, **{"X-Tenant": "bolt"}))
        assert answer.json()["model"] == "policy@bolt/v1"
        assert (await _ask(app_key)).json()["model"] == "policy@v1"
        listed = {m["id"] for m in (await a.get("/v1/models")).json()["data"]}
        assert "policy@acme/v1" in listed and not any("bolt" in m for m in listed)  # no other tenant's names
        # over the store API on the same port, acme's key cannot read bolt's rollout
        assert (await a.get(f"/api/rollouts/{ro_b}")).status_code == 404
        assert (await a.get(f"/api/rollouts/{ro_a}")).json()["tenant"] == "acme"
    # acme's 3 calls reached only acme's adapter; bolt's engine served bolt's one call, nothing of acme's
    assert {host: e.served for host, e in engines.items()} == {"shared": 2, "acme": 3, "bolt": 1}
    spans = [s for s in store.list_spans() if s.llm is not None and s.status == "ok"]
    acme = [s for s in spans if s.tenant == "acme"]
    assert [s.llm.version for s in acme] == ["policy@acme/v1"] * 3  # type: ignore[union-attr]
    assert all(s.rollout_id == ro_a for s in acme)
    by_tenant = {(s.tenant, s.llm.version) for s in spans}  # type: ignore[union-attr]
    assert by_tenant == {
        ("acme", "policy@acme/v1"),
        ("carp", "policy@v1"),
        ("bolt", "policy@bolt/v1"),
        (None, "policy@v1"),
    }
    store.tenant_keys.revoke(store.tenant_keys.list("acme")[0].key_id)  # revoked while the gateway runs
    async with _client(app, key_a) as a:
        assert (await _ask(a)).status_code == 401
    assert key_b  # bolt's key was issued but never used: issuing keys needs no restart either


async def test_without_tenants_the_header_changes_nothing(
    store: SQLStore, engines: dict[str, ScriptedUpstream]
) -> None:
    app = create_gateway(store, tenant_router(engines), GATEWAY_KEY, transport=ByHostTransport(engines))
    async with _client(app, GATEWAY_KEY, **{"X-Tenant": "acme"}) as client:
        assert (await _ask(client)).json()["model"] == "policy@v1"
    assert [s.tenant for s in store.list_spans()] == [None]


async def test_a_tenant_adapter_that_cannot_load_is_a_503_naming_no_other_tenant(
    store: SQLStore, engines: dict[str, ScriptedUpstream]
) -> None:
    from agentforge.errors import ServingError

    class Busy:
        def acquire_cached(self, tenant: str, model: str) -> None:
            return None

        def acquire(self, tenant: str, model: str) -> tuple[str, object]:
            raise ServingError("policy@bolt/v1 (least recently used) still had calls in flight after 30s")

        def serves_own(self, tenant: str, model: str) -> bool:
            return True

    app = create_gateway(
        store,
        tenant_router(engines),
        GATEWAY_KEY,
        transport=ByHostTransport(engines),
        tenant_models=Busy(),
        tenant_header=True,
    )  # type: ignore[arg-type]
    async with _client(app, GATEWAY_KEY, **{"X-Tenant": "acme"}) as client:
        answer = await _ask(client)
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "tenant_adapter_unavailable"
    assert "bolt" not in answer.text
    (span,) = store.list_spans()
    assert span.status == "error" and span.tenant == "acme"


async def test_each_tenants_calls_reach_the_engine_under_its_own_prefix_cache_salt(store: SQLStore) -> None:
    """Issue 36: the engine's prefix cache is namespaced per tenant (vLLM's ``cache_salt``): a tenant's calls share
    one salt, another tenant's differ, calls with no tenant carry none, and a salt is unpredictable (an HMAC under
    a secret of the gateway process, not the tenant's name). A client cannot set it itself (an engine-level field)."""
    engine = ScriptedUpstream(["x"] * 5)  # not cycling: it records every request
    router = ModelRouter()
    router.register("policy@v1", engine.upstream("http://shared/v1"))
    router.set_alias("policy", "policy@v1")
    directory = TenantKeyCache(store.tenant_keys, cache_s=0)
    app = create_gateway(
        store,
        router,
        GATEWAY_KEY,
        transport=ByHostTransport({"shared": engine}),
        tenants=directory,
        tenant_header=True,
    )
    key_a, key_b = (store.tenant_keys.issue(t) for t in ("acme", "bolt"))
    async with _client(app, key_a) as a, _client(app, key_b) as b, _client(app, GATEWAY_KEY) as shared:
        for client in (a, a, b, shared):
            assert (await _ask(client)).status_code == 200
        own = await a.post(
            "/v1/chat/completions",
            json={"model": "policy", "messages": [{"role": "user", "content": "hi"}], "cache_salt": "bolt's"},
        )
        assert own.status_code == 400 and own.json()["error"]["param"] == "cache_salt"
    salts = [r.body.get("cache_salt") for r in engine.requests]
    assert len(salts) == 4 and salts[0] == salts[1] and salts[3] is None
    assert salts[0] != salts[2] and all(len(s) == 64 and "acme" not in s for s in salts[:3])
    other = create_gateway(
        store, router, GATEWAY_KEY, transport=ByHostTransport({"shared": engine}), tenants=directory
    )
    async with _client(other, key_a) as a_again:
        assert (await _ask(a_again)).status_code == 200
    assert engine.requests[-1].body["cache_salt"] not in salts  # another gateway process, another secret
