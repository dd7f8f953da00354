"""Per-tenant training reads and writes one tenant's rollouts only: RolloutSource(tenant=...) enqueues the tenant's
rollouts pinned to its lineage's version, and the continual FeedbackSource reads only its rated conversations."""

from __future__ import annotations

import threading

from agentforge.testing import memory_store
from agentforge.trainers.feedback import APP_AGENT, FeedbackSource
from agentforge.trainers.publish import StorePublisher
from agentforge.trainers.rollouts import RolloutSource
from agentforge.types import LLMCall, ResourceVersion, Reward, Rollout, Span, SpanKind, Task


def _rated(store, tenant: str | None) -> str:  # type: ignore[no-untyped-def]
    rollout = store.enqueue_rollout(Rollout(agent=APP_AGENT, tenant=tenant))
    request = {"model": "policy", "messages": [{"role": "user", "content": f"hi from {tenant}"}]}
    store.add_span(
        Span(rollout_id=rollout.rollout_id, kind=SpanKind.llm, llm=LLMCall(request=request), tenant=tenant)
    )
    store.add_reward(Reward(rollout_id=rollout.rollout_id, value=1.0, final=True, source="user_feedback"))
    return rollout.rollout_id


def test_a_tenants_sources_see_only_its_rollouts() -> None:
    store = memory_store()
    store.publish_resource(ResourceVersion(name="policy@acme", kind="adapter", payload={"path": "/a"}))
    current = StorePublisher(store, alias="policy@acme").current
    tasks = {"t1": Task(task_id="t1")}
    source = RolloutSource(store, tasks, 2, current, tenant="acme", run_id="run-acme")
    shared = RolloutSource(store, tasks, 2, StorePublisher(store).current, run_id="run-shared")
    mine = source.enqueue(["t1", "t1"])
    shared.enqueue(["t1", "t1"])
    assert {(r.tenant, r.resources["policy"]) for r in mine} == {("acme", "policy@acme/v1")}
    assert {r.rollout_id for r in store.list_rollouts(tenant="acme")} == {r.rollout_id for r in mine}
    assert [
        r.rollout_id
        for r in RolloutSource(store, tasks, 2, current, tenant="acme", run_id="run-acme").formed_earlier(0)
    ] == [r.rollout_id for r in mine]
    ours, theirs = _rated(store, "acme"), _rated(store, "bolt")
    _rated(store, None)
    feedback = FeedbackSource(store, source, 1, threading.Event())
    assert [o.rollout.rollout_id for o in feedback.pending()] == [ours]
    everyone = FeedbackSource(store, shared, 1, threading.Event())
    assert theirs in {o.rollout.rollout_id for o in everyone.pending()}
    store.close()
