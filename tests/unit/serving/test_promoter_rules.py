"""GatedPublisher's bookkeeping without a model: which rollouts count as live reward of a version, an
evaluation that fails refuses (and unloads) the candidate, and a rollback needs a retained version.

The engine is the bookkeeping ``FakeServer``; the router, hot-swapper and store are the real ones. The
end-to-end behaviour on the real model is in ``test_promotion.py``.
"""

from __future__ import annotations

import pytest
from adapters import rank_adapter
from serving_helpers import FakeServer

from agentforge.errors import ConfigError, RolloutTimeout
from agentforge.gate import RollbackRule, list_decisions
from agentforge.gateway.router import ModelRouter
from agentforge.serving.canary import CanaryResult
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.promoter import GatedPublisher, LiveRewards
from agentforge.serving.publisher import HotSwapPublisher
from agentforge.testing import memory_store
from agentforge.trainers.publish import rollback_adapter
from agentforge.types import LLMCall, Reward, Rollout, RolloutState, Span, SpanKind


def ok(_upstream: object) -> CanaryResult:
    return CanaryResult("ok", [1])


def _rollout(store, versions: list[str], reward: float | None, **fields) -> str:  # type: ignore[no-untyped-def]
    rid = store.enqueue_rollout(Rollout(**fields)).rollout_id
    for v in versions:
        store.add_span(Span(rollout_id=rid, kind=SpanKind.llm, llm=LLMCall(model="policy", version=v)))
    if reward is not None:
        store.add_reward(Reward(rollout_id=rid, value=reward, final=True))
    return rid


def test_live_rewards_count_only_unpinned_scored_rollouts_served_by_one_version() -> None:
    store = memory_store()
    live = LiveRewards(store, "policy")
    _rollout(store, ["policy@v1"], 1.0)
    _rollout(store, ["policy@v2", "policy@v2"], 0.0)  # two calls, one version
    _rollout(store, ["policy@v1", "policy@v2"], 1.0)  # straddles a flip: neither
    _rollout(store, ["policy@v2"], 1.0, resources={"policy": "policy@v2"})  # pinned (training/eval): not live
    late = _rollout(store, ["policy@v1"], None)  # feedback not in yet
    failed = _rollout(store, ["policy@v2"], None)
    store.update_rollout(failed, state=RolloutState.running)
    store.update_rollout(failed, state=RolloutState.failed)
    assert live.collect(0.0) == {"policy@v1": [1.0], "policy@v2": [0.0]}
    store.add_reward(Reward(rollout_id=late, value=0.5, final=True))  # arrives minutes later
    assert live.collect(0.0) == {"policy@v1": [1.0, 0.5], "policy@v2": [0.0]}
    store.close()


def test_an_evaluation_that_fails_refuses_and_unloads_the_candidate() -> None:
    store, router = memory_store(), ModelRouter()
    server = FakeServer(4)
    swapper = HotSwapper(server, router, retain=1, canary=ok)

    def evaluate(version: str) -> list[float]:
        raise RolloutTimeout(f"held-out rollouts of {version} unfinished")

    publisher = GatedPublisher(swapper, store, evaluate=evaluate)
    live = publisher.current()
    with pytest.raises(RolloutTimeout):
        publisher.publish(rank_adapter(8), step=3)
    assert router.alias("policy") == live and server.loaded == [] and "policy@v1" not in router.models()
    (refusal,) = list_decisions(store, "policy")
    assert (refusal.stage, refusal.outcome, refusal.candidate) == ("eval", "refused", "policy@v1")
    assert "could not decide" in refusal.reason and "RolloutTimeout" in refusal.reason
    assert not any(r.active for r in store.list_resources("policy"))  # the store never activated it
    with pytest.raises(ConfigError, match="retain >= 1"):
        GatedPublisher(HotSwapper(FakeServer(4), ModelRouter(), canary=ok), store, rollback=RollbackRule())
    store.close()


def test_promote_and_roll_back_are_flips_between_loaded_versions() -> None:
    router = ModelRouter()
    server = FakeServer(4)
    swapper = HotSwapper(server, router, retain=1, canary=ok)
    swapper.register_base()
    first = swapper.swap(rank_adapter(8))
    staged = swapper.swap(rank_adapter(8), flip=False)
    assert router.alias("policy") == first and staged in router.models()  # staged: routable, not the default
    swapper.promote(staged)
    assert router.alias("policy") == staged and first in swapper.live_versions()  # first is retained
    swapper.promote(first, retire_old=True)  # the rollback
    assert router.alias("policy") == first and swapper.wait_drained(10)
    assert server.loaded == [first] and staged not in router.models()


def test_restore_after_a_rollback_to_the_base_serves_the_base() -> None:
    store, router = memory_store(), ModelRouter()
    swapper = HotSwapper(FakeServer(4), router, canary=ok)
    publisher = HotSwapPublisher(swapper, store)
    first = publisher.publish(rank_adapter(8), step=1)
    assert router.alias("policy") == first
    rollback_adapter(store, 0)  # the store's active record now marks the base model
    assert publisher.restore() == "policy@v0" and router.alias("policy") == "policy@v0"
    store.close()
