"""The promotion gate's rules (eval gate, canary, rollback) and its decision log in every store backend."""

from __future__ import annotations

import math

import pytest

from agentforge.errors import ConfigError
from agentforge.gate import (
    CanaryRule,
    Decision,
    EvalGate,
    RollbackRule,
    list_decisions,
    paired_test,
    record_decision,
)
from agentforge.ports import TraceStore
from agentforge.types import ResourceVersion


@pytest.mark.parametrize(("wins", "losses"), [(7, 0), (6, 1), (5, 3), (2, 6), (10, 10)])
def test_sign_test_equals_scipy_binomtest(wins: int, losses: int) -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    before = [0.0] * wins + [1.0] * losses + [1.0, 0.0, 0.0]  # three ties: they never count
    after = [1.0] * wins + [0.0] * losses + [1.0, 0.0, 0.0]
    sig = paired_test(before, after)
    expected = scipy_stats.binomtest(wins, wins + losses, 0.5, alternative="greater").pvalue
    assert sig.method == "exact sign test" and (sig.wins, sig.losses) == (wins, losses)
    assert math.isclose(sig.p_value, expected, rel_tol=1e-12)


def test_eval_gate_needs_gain_and_significance() -> None:
    gate = EvalGate(max_p=0.05, min_gain=0.1)
    live = [0.0] * 8 + [1.0] * 2
    better = [1.0] * 8 + [1.0] * 2  # 8 wins, 0 losses: p = 1/256
    passed = gate.judge(live, better)
    assert passed.passed and passed.test.p_value == 1 / 256 and passed.gain == pytest.approx(0.8)
    assert "8 wins / 0 losses" in passed.reason
    worse = [0.0] * 10  # trained toward wrong answers: 2 losses
    refused = gate.judge(live, worse)
    assert not refused.passed and refused.gain == pytest.approx(-0.2) and refused.test.p_value == 1.0
    slight = [1.0] + [0.0] * 7 + [1.0] * 2  # one win: gain 0.1 is not > 0.1 and p = 0.5
    assert not gate.judge(live, slight).passed
    assert EvalGate(max_p=None, min_gain=0.05).judge(live, slight).passed  # gain alone when no test is asked
    with pytest.raises(ConfigError, match="max_p=0"):
        EvalGate(max_p=0.0)
    with pytest.raises(ConfigError, match="equally long"):
        gate.judge([1.0], [1.0, 0.0])


def test_canary_and_rollback_rules() -> None:
    rule = CanaryRule(share=0.25, rollouts=4, margin=0.1)
    assert rule.judge([1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]).passed  # 0.75 vs 0.75
    regressed = rule.judge([0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0])
    assert not regressed.passed and regressed.version_mean == 0.25 and regressed.reference_mean == 0.75
    too_few = rule.judge([1.0, 1.0], [0.0])
    assert not too_few.passed and "needs 4" in too_few.reason
    no_reference = rule.judge([1.0] * 4, [1.0, 1.0])  # the live arm must have served as many in the period
    assert not no_reference.passed and no_reference.reference_n == 2
    with pytest.raises(ConfigError, match="share=1.0"):
        CanaryRule(share=1.0)
    watch = RollbackRule(window=3, margin=0.2)
    assert watch.judge([1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 1.0]).passed  # 0.667 vs 0.75: within 0.2
    dropped = watch.judge([0.0, 0.0, 1.0, 1.0, 1.0], [1.0, 1.0])  # only the first 3 count
    assert not dropped.passed and dropped.version_n == 3 and dropped.version_mean == pytest.approx(1 / 3)
    with pytest.raises(ConfigError, match="window=0"):
        RollbackRule(window=0)


def test_decisions_are_store_records_in_every_backend(store: TraceStore) -> None:
    store.publish_resource(ResourceVersion(name="policy", kind="adapter", payload={"base": True}))
    evidence = {"live_scores": [1.0, 0.0], "candidate_scores": [0.0, 0.0], "p_value": 1.0}
    first = record_decision(
        store, Decision("policy", "eval", "refused", "policy@v2", "policy@v1", "worse", evidence)
    )
    second = record_decision(store, Decision("policy", "promote", "promoted", "policy@v3", "policy@v1", "ok"))
    record_decision(
        store, Decision("prompt:triage", "eval", "passed", "prompt:triage@v2", "prompt:triage@v1", "ok")
    )
    assert (first.number, second.number) == (1, 2) and first.created_at > 0
    listed = list_decisions(store, "policy")
    assert [(d.stage, d.outcome, d.candidate) for d in listed] == [
        ("eval", "refused", "policy@v2"),
        ("promote", "promoted", "policy@v3"),
    ]
    assert listed[0].evidence == evidence and listed[0].live == "policy@v1"
    assert {d.name for d in list_decisions(store)} == {"policy", "prompt:triage"}
    assert store.get_resource("policy").version == 1  # decisions never touch what is active
    assert not any(r.active for r in store.list_resources("promotion:policy"))


def test_non_inferiority_gate_passes_a_gain_with_one_loss() -> None:
    """The case the n=20 sign test refused (5 wins, 1 loss: p = 0.109) passes the margin rule on a sized slice,
    and a candidate as much worse is refused."""
    live = [0.0] * 5 + [1.0] + [1.0] * 14
    better = [1.0] * 5 + [0.0] + [1.0] * 14  # +0.20, one loss
    assert not EvalGate(max_p=0.1).judge(live, better).passed
    gate = EvalGate.sized(0.05)
    result = gate.judge(live, better)
    assert result.passed and result.test.p_value == pytest.approx(0.109375)
    assert "lower 95% bound" in result.reason and gate.lower_bound(result.test) > -0.05
    assert not gate.judge(better, live).passed  # the same numbers the other way round
    tied = gate.judge(live, list(live))
    assert not tied.passed  # no gain: refused however sure the bound is
    with pytest.raises(ConfigError, match="margin=1.5"):
        EvalGate(margin=1.5)


def test_gate_plan_sizes_from_the_effect() -> None:
    from agentforge.gate_power import pass_probability, plan_gate

    plan = plan_gate(0.05, alpha=0.05, power=0.8, discordance=0.2)
    assert plan.n == 124 and "124 paired tasks" in plan.describe()
    assert plan_gate(0.05, discordance=0.3).n == 186  # more disagreement, more tasks
    assert plan_gate(0.10, discordance=0.2).n == 31  # four times fewer for twice the effect
    kw = {"effect": 0.05, "alpha": 0.05, "discordance": 0.2}
    assert pass_probability(0.05, plan.n, **kw) >= 0.8
    assert pass_probability(-0.05, plan.n, **kw) == pytest.approx(0.05, abs=0.002)
    assert pass_probability(0.05, 20, **kw) < 0.5  # the old 20-task slice: a coin flip at best
    for discordance in (
        0.05,
        0.1,
        0.3,
    ):  # a wrong guess of the discordance costs power, never the refusal rate
        worse = pass_probability(-0.05, 62, effect=0.05, alpha=0.05, discordance=discordance)
        assert worse <= 0.05 + 1e-9
    with pytest.raises(ConfigError, match="power=0.4"):
        plan_gate(0.05, power=0.4)


def test_sized_gate_meets_its_error_rates_by_simulation() -> None:
    """Draw paired 0/1 outcomes with a known true gain and discordance: the measured pass rates of the sized
    gate meet the plan (within simulation error), where the old sign test at p <= 0.1 on 20 tasks does not."""
    import random

    from agentforge.gate_power import plan_gate

    plan, rng = plan_gate(0.05, discordance=0.2), random.Random(7)

    def pass_rate(gate: EvalGate, gain: float, n: int, trials: int = 400) -> float:
        win, loss = (0.2 + gain) / 2, (0.2 - gain) / 2
        hits = 0
        for _ in range(trials):
            live, cand = [], []
            for _ in range(n):
                u = rng.random()
                live.append(0.0 if u < win else 1.0 if u < win + loss else 0.5 < rng.random())
                cand.append(1.0 if u < win else 0.0 if u < win + loss else live[-1])
            hits += gate.judge([float(x) for x in live], cand).passed
        return hits / trials

    sized = EvalGate.sized(0.05)
    assert pass_rate(sized, 0.05, plan.n) >= 0.74  # planned 0.80; 400 trials: ±0.04 at 2 sd
    assert pass_rate(sized, -0.05, plan.n) <= 0.08  # planned 0.05
    assert pass_rate(EvalGate(max_p=0.1), 0.05, 20) < 0.2  # the old gate: a +5 candidate rarely passes
