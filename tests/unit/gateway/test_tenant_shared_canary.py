"""The shared policy's traffic canary and tenants (TenantAdapters on the recording fake engine, the gateway's pins):
a tenant served an adapter of its own never meets the shared candidate; a tenant served the shared policy does."""

from __future__ import annotations

from serving_helpers import FakeServer

from agentforge.gateway.app import create_gateway
from agentforge.gateway.pins import PinCache
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.serving.tenants import TenantAdapters
from agentforge.testing import memory_store
from agentforge.trainers.publish import rollback_adapter
from agentforge.types import ResourceVersion, Rollout


def test_the_shared_canary_never_takes_a_tenant_served_its_own_adapter() -> None:
    store, router = memory_store(), ModelRouter()
    store.publish_resource(ResourceVersion(name="policy@a", kind="adapter", payload={"path": "/ad/a"}))
    for version in ("policy@v0", "policy@v5"):
        router.register(version, Upstream(base_url="http://fake/v1", model=version))
    router.set_alias("policy", "policy@v0")
    adapters = TenantAdapters(FakeServer(max_loras=4), router, store, max_loaded=2, refresh_s=0)  # type: ignore[arg-type]
    gateway = create_gateway(store, router, tenant_models=adapters, include_store_api=False).state.gateway
    pins: PinCache = gateway.pins
    router.set_canary("policy", "policy@v5", 0.5)  # the shared policy's candidate on half its rollouts

    def served(tenant: str | None) -> set[str]:
        out = set()
        for _ in range(40):
            rid = store.enqueue_rollout(Rollout(tenant=tenant)).rollout_id
            target = pins.target(rid, "policy")
            version, _ = adapters.acquire(tenant, target) if tenant else router.acquire(target)
            router.release(version)
            out.add(version)
        return out

    assert served("a") == {"policy@a/v1"}  # its own adapter, never the shared candidate
    assert served("b") == {"policy@v0", "policy@v5"}  # no lineage: served the shared policy, and its canary
    assert served(None) == {"policy@v0", "policy@v5"}
    rollback_adapter(
        store, 0, alias="policy@a"
    )  # a back on the shared policy: it meets the shared canary again
    assert served("a") == {"policy@v0", "policy@v5"}
