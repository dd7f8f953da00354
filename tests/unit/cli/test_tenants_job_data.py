"""The three-tenant job's wiring (examples/tenants_job.py): each tenant's data, its lineage, its table."""

from __future__ import annotations

import io

import pytest
from example_app import load_example
from rich.console import Console

from agentforge.testing import memory_store
from agentforge.types import ResourceVersion

pytestmark = pytest.mark.slow  # importing the example loads torch through the front door (~15 s here)


@pytest.fixture(scope="module")
def job():  # type: ignore[no-untyped-def]
    return load_example("tenants_job.py", "tenants_job_example")


def test_each_tenant_gets_its_own_balanced_labels_and_a_disjoint_held_out_split(job) -> None:  # type: ignore[no-untyped-def]
    seen_ids: set[str] = set()
    for tenant, (_, labels) in job.TENANTS.items():
        train, held_out = job.tenant_tasks(tenant, 40, 20, seed=0)
        assert len(train) == 40 and len(held_out) == 20
        assert {t.metadata["label"] for t in train} == set(labels) == {t.metadata["label"] for t in held_out}
        counts = [sum(t.metadata["label"] == label for t in train) for label in labels]
        assert max(counts) - min(counts) <= 1
        assert not {t.input["text"] for t in train} & {t.input["text"] for t in held_out}
        assert all(t.input["temperature"] == 0.0 for t in held_out)
        ids = {t.task_id for t in train + held_out}
        assert len(ids) == 60 and not ids & seen_ids  # task ids never collide across tenants
        seen_ids |= ids


def test_a_tenant_lineage_serves_the_shared_policy_until_it_publishes_its_own(job) -> None:  # type: ignore[no-untyped-def]
    store = memory_store()
    bank, shop = job.Lineage(store, "bank", "policy@v0"), job.Lineage(store, "shop", "policy@v0")
    assert bank.current() == "policy@v0"
    store.publish_resource(ResourceVersion(name="policy@bank", kind="adapter", payload={"path": "/x"}))
    assert bank.current() == "policy@bank/v1" and shop.current() == "policy@v0"


def test_the_tenant_table_names_both_versions_and_the_gain(job) -> None:  # type: ignore[no-untyped-def]
    r = {
        "shared": "policy@v0",
        "version": "policy@assistant/v2",
        "n_eval": 60,
        "eval_before_s": 30.0,
        "train_s": 180.0,
        "before": {"acc": 0.25, "top": "weather 70%", "foreign": 0, "spans": 60},
        "after": {"acc": 0.6, "top": "alarm 30%", "foreign": 0, "spans": 60},
    }
    console = Console(file=io.StringIO(), width=120, record=True, color_system=None)
    console.print(job.tenant_table("assistant", r))
    text = console.export_text()
    assert "policy@v0" in text and "policy@assistant/v2" in text and "+0.350" in text and "0/60" in text


def test_with_a_canary_share_each_tenant_publishes_through_its_whole_promotion_gate(job) -> None:  # type: ignore[no-untyped-def]
    from serving_helpers import FakeServer

    from agentforge.gateway.router import ModelRouter, Upstream
    from agentforge.serving.lineage import TenantLineage
    from agentforge.serving.tenants import TenantAdapters

    store, router = memory_store(), ModelRouter()
    router.register("policy@v0", Upstream(base_url="http://fake/v1", model="base"))
    router.set_alias("policy", "policy@v0")
    adapters = TenantAdapters(FakeServer(max_loras=4), router, store, max_loaded=2)  # type: ignore[arg-type]
    args = job.parse_args(["--canary-share", "0.3", "--rollback-window", "16", "--live-margin", "0.05"])
    gate = job.live_gate(args, store, adapters, "bank", [])
    assert isinstance(gate.lineage, TenantLineage) and gate.alias == "policy@bank" and gate.evaluate is None
    assert (gate.canary.share, gate.canary.rollouts, gate.canary.margin) == (0.3, 8, 0.05)
    assert (gate.rollback.window, gate.rollback.margin) == (16, 0.05)
    assert job.Lineage(store, "bank", "policy@v0", gate).current() == "policy@v0"  # no adapter yet: shared
    store.publish_resource(ResourceVersion(name="policy@bank", kind="adapter", payload={"base": True}))
    assert job.Lineage(store, "bank", "policy@v0", gate).current() == "policy@v0"  # rolled back to the shared
