"""A lineage published through the eval gate (GatedStorePublisher): a candidate that does not beat the live version
on the fixed slice is recorded but never activated; one that does becomes the active version; every step is a stored
decision with its numbers; a slice that cannot be scored refuses the candidate and says why."""

from __future__ import annotations

import pytest
from adapters import rank_adapter

from agentforge.gate import EvalGate, list_decisions
from agentforge.testing import memory_store
from agentforge.trainers.publish import GatedStorePublisher

pytestmark = (
    pytest.mark.slow
)  # one tiny real LoRA adapter on the default model (cached after the first test run)

LIVE = [1.0] * 6 + [0.0] * 6


def test_a_worse_candidate_stays_inactive_and_a_better_one_becomes_the_tenants_version() -> None:
    store = memory_store()
    adapter = rank_adapter(8)
    slices = {"policy@v0": LIVE, "policy@acme/v1": [0.0] * 12, "policy@acme/v2": [1.0] * 11 + [0.0]}
    asked: list[str] = []

    def evaluate(version: str) -> list[float]:
        asked.append(version)
        return slices[version]

    gated = GatedStorePublisher(store, "policy@acme", evaluate, EvalGate(max_p=0.05), fallback="policy@v0")
    assert gated.current() == "policy@v0"  # no adapter yet: the shared policy serves the tenant
    assert gated.publish(adapter, step=4) == "policy@v0"
    assert gated.current() == "policy@v0" and [r.ref for r in store.list_resources("policy@acme")] == [
        "policy@acme/v1"
    ]
    assert gated.publish(adapter, step=8) == "policy@acme/v2"
    assert gated.current() == "policy@acme/v2" == store.get_resource("policy@acme").ref
    assert asked == ["policy@v0", "policy@acme/v1", "policy@acme/v2"]  # the live slice is scored once
    stored = list_decisions(store, "policy@acme")
    assert [(d.stage, d.outcome, d.candidate, d.live) for d in stored] == [
        ("eval", "refused", "policy@acme/v1", "policy@v0"),
        ("eval", "passed", "policy@acme/v2", "policy@v0"),
        ("promote", "promoted", "policy@acme/v2", "policy@v0"),
    ]
    refused = stored[0].evidence
    assert (
        refused["candidate_scores"] == [0.0] * 12
        and refused["live_scores"] == LIVE
        and refused["gain"] == -0.5
    )
    assert stored[1].evidence["test"]["wins"] == 5 and stored[1].evidence["test"]["p_value"] <= 0.05
    assert [d.number for d in gated.decisions] == [d.number for d in stored]


def test_a_slice_that_cannot_be_scored_refuses_the_candidate_with_the_reason() -> None:
    store = memory_store()

    def evaluate(version: str) -> list[float]:
        raise TimeoutError(f"held-out rollouts of {version} did not finish")

    gated = GatedStorePublisher(store, "policy@acme", evaluate, fallback="policy@v0")
    with pytest.raises(TimeoutError):
        gated.publish(rank_adapter(8), step=1)
    (decision,) = list_decisions(store, "policy@acme")
    assert decision.outcome == "refused" and "did not finish" in decision.reason
    assert gated.current() == "policy@v0"
