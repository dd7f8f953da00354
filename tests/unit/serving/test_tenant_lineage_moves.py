"""A tenant lineage's moves (promotion, rollback, canary) against what serving does meanwhile, on the recording fake
engine: a store read in flight while the lineage moves, other tenants' cold starts evicting a candidate, an engine
that no longer holds an adapter, an engine that cannot load a candidate."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving_helpers import FakeServer

from agentforge.errors import NotFoundError, ServingError
from agentforge.gate import CanaryRule, EvalGate, list_decisions
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.serving.lineage import TenantLineage
from agentforge.serving.promoter import GatedPublisher
from agentforge.serving.tenants import TenantAdapters
from agentforge.stores.sql import SQLStore
from agentforge.testing import memory_store
from agentforge.types import ResourceVersion


@pytest.fixture
def store() -> Iterator[SQLStore]:
    store = memory_store()
    for tenant in "abc":
        store.publish_resource(
            ResourceVersion(name=f"policy@{tenant}", kind="adapter", payload={"path": f"/ad/{tenant}"})
        )
    yield store  # type: ignore[misc]
    store.close()


def _adapters(
    store: Any, server: FakeServer | None = None, max_loaded: int = 3
) -> tuple[TenantAdapters, FakeServer, ModelRouter]:
    server, router = server or FakeServer(max_loras=4), ModelRouter()
    router.register("policy@v0", Upstream(base_url="http://fake/v1", model="base"))
    router.set_alias("policy", "policy@v0")
    return TenantAdapters(server, router, store, max_loaded=max_loaded), server, router  # type: ignore[arg-type]


def _call(adapters: TenantAdapters, router: ModelRouter, tenant: str, model: str = "policy") -> str:
    version, _ = adapters.acquire(tenant, model)
    router.release(version)
    return version


def _serving_a_v2(adapters: TenantAdapters, router: ModelRouter, store: SQLStore) -> TenantLineage:
    """Publish ``policy@a/v2`` inactive, load and promote it through ``a``'s lineage; ``a`` is served it."""
    lineage = TenantLineage(adapters, store, "a")
    store.publish_resource(
        ResourceVersion(name="policy@a", kind="adapter", payload={"path": "/ad/a2"}), activate=False
    )
    lineage.load(Path("/ad/a2"), "policy@a/v2")
    lineage.promote("policy@a/v2")
    assert _call(adapters, router, "a") == "policy@a/v2"
    return lineage


class SlowReads:
    """The store, but a read of ``policy@a``'s active version pauses (after reading) while ``hold`` is set."""

    def __init__(self, inner: SQLStore) -> None:
        self.inner, self.hold = inner, threading.Event()
        self.reading, self.go = threading.Event(), threading.Event()

    def get_resource(self, name: str, version: int | None = None) -> ResourceVersion:
        found = self.inner.get_resource(name, version)
        if self.hold.is_set() and name == "policy@a" and version is None:
            self.hold.clear()
            self.reading.set()
            assert self.go.wait(5)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_store_read_in_flight_during_a_rollback_never_serves_the_version_rolled_back_from(
    store: SQLStore,
) -> None:
    slow = SlowReads(store)
    adapters, server, router = _adapters(slow)  # refresh_s 2: only refresh() makes a move serve at once
    lineage = _serving_a_v2(adapters, router, store)
    adapters.refresh("a")  # the next call of a reads the store...
    slow.hold.set()
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(_call(adapters, router, "a")))
    reader.start()
    assert slow.reading.wait(5)  # ...and has read v2 as active when the watch rolls a back
    lineage.promote("policy@a/v1", rollback=True)
    slow.go.set()
    reader.join(5)
    # the read from before the rollback is not cached over it: v2 is neither served again nor loaded again
    assert _call(adapters, router, "a") == "policy@a/v1"
    assert got == ["policy@a/v1"] and "policy@a/v2" not in server.loaded


def _adapter_dir(path: Path) -> Path:
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    return path


def test_a_tenant_candidate_evicted_by_other_tenants_before_its_canary_still_gets_its_canary(
    store: SQLStore, tmp_path: Path
) -> None:
    adapters, server, router = _adapters(store, max_loaded=2)

    def evaluate(version: str) -> list[float]:
        for tenant in "bc":  # other tenants' customers meanwhile: their cold starts take both slots
            _call(adapters, router, tenant)
        return [1.0] * 6 if version == "policy@a/v2" else [0.0] * 6

    gate = GatedPublisher(
        TenantLineage(adapters, store, "a"),
        store,
        evaluate=evaluate,
        gate=EvalGate(max_p=0.05),
        canary=CanaryRule(share=0.5, rollouts=1, timeout_s=0.3),
        poll_s=0.05,
        grace_s=0.0,
    )
    assert (
        gate.publish(_adapter_dir(tmp_path / "a2"), 1) == "policy@a/v1"
    )  # no live traffic: refused on timeout
    outcomes = [(d.stage, d.outcome) for d in gate.decisions]
    assert outcomes == [("eval", "passed"), ("canary", "refused")], gate.decisions[-1].reason
    assert "policy@a/v2" not in server.loaded and _call(adapters, router, "a") == "policy@a/v1"


class RestartedServer(FakeServer):
    """An engine that lost its adapters behind serving's back (restarted): unloading one it had says not loaded."""

    def forget(self, name: str) -> None:
        self.loaded.remove(name)

    def unload_adapter(self, name: str) -> None:
        if name not in self.loaded:
            raise NotFoundError(f"adapter {name!r} is not loaded on {self.base_url}")
        super().unload_adapter(name)


def test_a_rollback_completes_when_the_engine_no_longer_holds_the_version(store: SQLStore) -> None:
    server = RestartedServer(max_loras=4)
    adapters, _, router = _adapters(store, server)
    lineage = _serving_a_v2(adapters, router, store)
    server.forget("policy@a/v2")
    # a rollback that happened must not raise (the gate's watch stored "kept" when it did)
    lineage.promote("policy@a/v1", rollback=True)
    assert _call(adapters, router, "a") == "policy@a/v1" and adapters.loaded() == ["policy@a/v1"]
    store.publish_resource(
        ResourceVersion(name="policy@a", kind="adapter", payload={"path": "/ad/a3"}), activate=False
    )
    lineage.load(Path("/ad/a3"), "policy@a/v3")
    server.forget("policy@a/v3")
    lineage.discard("policy@a/v3")  # a refused candidate: unloaded (already), no error out of the gate
    assert adapters.loaded() == ["policy@a/v1"] and "policy@a/v3" not in router.models()


class DeadEngine(FakeServer):
    """An engine that died: every load fails."""

    def load_adapter(self, name: str, path: str) -> None:
        raise ServingError(f"the engine at {self.base_url} does not answer")


def test_a_candidate_the_engine_cannot_load_is_refused_on_record(store: SQLStore, tmp_path: Path) -> None:
    adapters, _, router = _adapters(store, DeadEngine(max_loras=4))
    gate = GatedPublisher(TenantLineage(adapters, store, "a"), store, evaluate=lambda v: [1.0])
    with pytest.raises(ServingError):
        gate.publish(_adapter_dir(tmp_path / "a2"), 1)
    assert store.get_resource("policy@a").version == 1  # still the live version
    [decision] = list_decisions(store, "policy@a")  # the published, never served candidate has its record
    assert (decision.candidate, decision.outcome, decision.live) == ("policy@a/v2", "refused", "policy@a/v1")
    assert "does not answer" in decision.reason
