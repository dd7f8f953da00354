"""TenantAdapters bookkeeping on a recording fake engine (the real-engine run is ``test_tenant_eviction``): least
recently used idle versions are unloaded first, a version with a request in flight never is, a cold start waits
for a slot (or fails after ``slot_wait_s``), a tenant without a lineage gets the shared alias."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from serving_helpers import FakeServer

from agentforge.errors import ConfigError, NotFoundError, ServingError
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.serving.tenants import TenantAdapters
from agentforge.stores.sql import SQLStore
from agentforge.testing import memory_store
from agentforge.types import ResourceVersion


@pytest.fixture
def store() -> Iterator[SQLStore]:
    store = memory_store()
    for tenant in "abcd":
        store.publish_resource(
            ResourceVersion(name=f"policy@{tenant}", kind="adapter", payload={"path": f"/ad/{tenant}"})
        )
    yield store  # type: ignore[misc]
    store.close()


def _adapters(
    store: SQLStore, max_loaded: int = 2, **kw: float
) -> tuple[TenantAdapters, FakeServer, ModelRouter]:
    server, router = FakeServer(max_loras=4), ModelRouter()
    router.register("policy@v0", Upstream(base_url="http://fake/v1", model="base"))
    router.set_alias("policy", "policy@v0")
    return TenantAdapters(server, router, store, max_loaded=max_loaded, **kw), server, router  # type: ignore[arg-type]


def _call(adapters: TenantAdapters, router: ModelRouter, tenant: str, model: str = "policy") -> str:
    version, _ = adapters.acquire(tenant, model)
    router.release(version)
    return version


def test_least_recently_used_idle_versions_are_unloaded_first(store: SQLStore) -> None:
    adapters, server, router = _adapters(store)
    assert [_call(adapters, router, t) for t in "aba"] == ["policy@a/v1", "policy@b/v1", "policy@a/v1"]
    assert _call(adapters, router, "c") == "policy@c/v1"  # b is the least recently used
    assert adapters.loaded() == server.loaded == ["policy@a/v1", "policy@c/v1"]
    assert router.models() == ["policy", "policy@a/v1", "policy@c/v1", "policy@v0"]
    assert _call(adapters, router, "e") == "policy@v0"  # no lineage: the shared version, nothing loaded
    metrics = adapters.metrics()
    assert {
        k: metrics[k] for k in ("tenants/loads", "tenants/evictions", "tenants/cold_starts", "tenants/hits")
    } == {"tenants/loads": 3.0, "tenants/evictions": 1.0, "tenants/cold_starts": 3.0, "tenants/hits": 1.0}
    assert metrics["tenants/loaded"] == 2.0 and metrics["tenants/cold_start_s_max"] >= 0.0


def test_a_version_with_a_request_in_flight_is_never_unloaded(store: SQLStore) -> None:
    adapters, server, router = _adapters(store, slot_wait_s=10)
    va, _ = adapters.acquire("a", "policy")  # both stay in flight
    vb, _ = adapters.acquire("b", "policy")
    got: list[str] = []
    cold = threading.Thread(target=lambda: got.append(_call(adapters, router, "c")))
    cold.start()
    time.sleep(0.3)
    assert got == [] and server.loaded == ["policy@a/v1", "policy@b/v1"]  # c waits for a (the LRU) to finish
    assert adapters.acquire_cached("a", "policy") is None  # no new call starts on a meanwhile (b's still do)
    vb2, _ = adapters.acquire("b", "policy")
    router.release(va)
    cold.join(5)
    assert got == ["policy@c/v1"] and server.loaded == [
        "policy@b/v1",
        "policy@c/v1",
    ]  # a went, b (busy) stayed
    router.release(vb)
    router.release(vb2)


def test_a_cold_start_fails_when_no_version_goes_idle(store: SQLStore) -> None:
    adapters, server, router = _adapters(store, max_loaded=1, slot_wait_s=0.2)
    adapters.acquire("a", "policy")
    with pytest.raises(ServingError, match="in\nflight|in flight"):
        adapters.acquire("b", "policy")
    assert server.loaded == ["policy@a/v1"] and adapters.loaded() == ["policy@a/v1"]


def test_pinned_versions_new_versions_and_limits(store: SQLStore) -> None:
    adapters, server, router = _adapters(store, refresh_s=0)
    store.publish_resource(ResourceVersion(name="policy@a", kind="adapter", payload={"path": "/ad/a2"}))
    assert _call(adapters, router, "a") == "policy@a/v2"  # the active version
    assert _call(adapters, router, "a", "policy@a/v1") == "policy@a/v1"  # a rollout pinned to v1 gets v1
    assert _call(adapters, router, "a", "policy@a") == "policy@a/v2"
    assert adapters.preload("b") == "policy@b/v1" and adapters.metrics()["tenants/cold_starts"] == 2.0
    with pytest.raises(ConfigError, match="max_loaded=9"):
        TenantAdapters(server, router, store, max_loaded=9)  # type: ignore[arg-type]
    assert TenantAdapters(server, router, store).max_loaded == 2  # type: ignore[arg-type]  # 4 slots - 2 for swaps
    # the shared swapper's retained versions stay loaded: they take slots from the tenants, default or not
    assert TenantAdapters(server, router, store, shared_retain=1).max_loaded == 1  # type: ignore[arg-type]
    with pytest.raises(
        ConfigError, match=r"max_loaded=4 .* \[1, 3\].* 1 versions the shared swapper retains"
    ):
        TenantAdapters(server, router, store, max_loaded=4, shared_retain=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_loaded=0"):
        TenantAdapters(server, router, store, shared_retain=2)  # type: ignore[arg-type]  # 4 - 2 - 2 leaves none


def test_the_live_reward_of_a_tenants_lineage_counts_only_its_own_traffic() -> None:
    from agentforge.serving.promoter import LiveRewards
    from agentforge.types import LLMCall, Reward, Rollout, Span, SpanKind

    store = memory_store()
    for tenant, version, value in (
        ("a", "policy@a/v1", 1.0),
        ("b", "policy@b/v1", 0.0),
        (None, "policy@v1", 0.5),
    ):
        rid = store.enqueue_rollout(Rollout(tenant=tenant)).rollout_id
        store.add_span(Span(rollout_id=rid, kind=SpanKind.llm, llm=LLMCall(model="policy", version=version)))
        store.add_reward(Reward(rollout_id=rid, value=value, final=True))
    assert LiveRewards(store, "policy", tenant="a").collect(0.0) == {"policy@a/v1": [1.0]}
    assert LiveRewards(store, "policy").collect(0.0) == {
        "policy@a/v1": [1.0],
        "policy@b/v1": [0.0],
        "policy@v1": [0.5],
    }
    store.close()


def test_the_warm_path_needs_no_store_read_and_no_load(store: SQLStore) -> None:
    adapters, server, router = _adapters(store)
    assert adapters.acquire_cached("a", "policy") is None  # nothing known yet: the gateway goes to a thread
    _call(adapters, router, "a")
    version, _ = adapters.acquire_cached("a", "policy")  # type: ignore[misc]
    assert version == "policy@a/v1" and router.inflight(version) == 1
    router.release(version)
    assert adapters.acquire_cached("a", "policy@a/v2") is None  # a version not loaded
    _call(adapters, router, "e")  # no lineage, now known: the shared alias at once
    assert adapters.acquire_cached("e", "policy")[0] == "policy@v0"  # type: ignore[index]


def test_a_tenant_rolled_back_to_v0_is_served_the_shared_policy_again(store: SQLStore) -> None:
    from agentforge.trainers.publish import rollback_adapter

    adapters, server, router = _adapters(store, refresh_s=0)
    assert _call(adapters, router, "a") == "policy@a/v1"
    assert rollback_adapter(store, 0, alias="policy@a").ref == "policy@a/v2"  # a version that marks the base
    assert _call(adapters, router, "a") == "policy@v0"  # not an error, not another tenant's adapter
    assert _call(adapters, router, "a", "policy@a/v2") == "policy@v0"  # a rollout pinned to that version too
    assert _call(adapters, router, "a", "policy@a/v1") == "policy@a/v1"  # older pins keep their own weights
    assert adapters.preload("a") is None and _call(adapters, router, "b") == "policy@b/v1"


def test_a_tenant_lineage_moves_load_unload_and_serve_at_once(store: SQLStore) -> None:
    from agentforge.serving.lineage import TenantLineage

    adapters, server, router = _adapters(store, max_loaded=3)  # refresh_s 2: a move must not wait for it
    lineage = TenantLineage(adapters, store, "a")
    assert lineage.alias == "policy@a" and lineage.model == "policy" and lineage.tenant == "a"
    assert lineage.current() == "policy@a/v1" == _call(adapters, router, "a")
    store.publish_resource(
        ResourceVersion(name="policy@a", kind="adapter", payload={"path": "/ad/a2"}), activate=False
    )
    assert lineage.load(Path("/ad/a2"), "policy@a/v2") == "policy@a/v2"  # loaded, routable, not the default
    assert "policy@a/v2" in server.loaded and _call(adapters, router, "a") == "policy@a/v1"
    lineage.discard("policy@a/v2")  # refused: unloaded, the live version untouched
    assert "policy@a/v2" not in server.loaded and _call(adapters, router, "a") == "policy@a/v1"
    lineage.load(Path("/ad/a2"), "policy@a/v2")
    lineage.promote("policy@a/v2")
    assert _call(adapters, router, "a") == "policy@a/v2" == lineage.current()  # no refresh_s wait
    lineage.promote("policy@a/v1", rollback=True)  # back, and the version rolled back from is unloaded
    assert _call(adapters, router, "a") == "policy@a/v1" and "policy@a/v2" not in server.loaded
    assert store.get_resource("policy@a").version == 1
    lineage.promote("policy@v0", rollback=True)  # back to the shared policy: a version marking the base
    assert store.get_resource("policy@a").payload["base"] and lineage.current() == "policy@v0"
    assert _call(adapters, router, "a") == "policy@v0" and "policy@a/v1" not in server.loaded
    assert _call(adapters, router, "b") == "policy@b/v1"  # another tenant: untouched throughout
    with pytest.raises(NotFoundError):
        adapters.preload("a", "policy@b/v1")  # a tenant's moves never load another tenant's version


def test_a_tenant_canary_meets_only_that_tenants_unpinned_rollouts(store: SQLStore) -> None:
    from agentforge.gateway.pins import PinCache
    from agentforge.types import Rollout

    _, _, router = _adapters(store)
    router.register("policy@a/v2", Upstream(base_url="http://fake/v1", model="policy@a/v2"))
    router.set_canary("policy@a", "policy@a/v2", 0.5)
    pins = PinCache(store, router)
    pins.loads_tenants = True

    def targets(tenant: str | None, **resources: str) -> set[str]:
        rids = [
            store.enqueue_rollout(Rollout(tenant=tenant, resources=resources)).rollout_id for _ in range(40)
        ]
        return {pins.target(rid, "policy") for rid in rids}

    assert targets("a") == {"policy", "policy@a/v2"}  # a sticky share of a's rollouts
    assert targets("a", policy="policy@a/v1") == {"policy@a/v1"}  # pinned (training, evaluation): never
    assert targets("b") == {"policy"} and targets(None) == {"policy"}  # other tenants' and shared: never
    rid = store.enqueue_rollout(Rollout(tenant="a")).rollout_id
    assert len({pins.target(rid, "policy") for _ in range(5)}) == 1  # sticky
    router.clear_canary("policy@a")
    assert targets("a") == {"policy"}
