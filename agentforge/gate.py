"""The promotion gate: the rules a new version must pass to become the served default, and the decision log.

One gate serves every trainer that publishes (``LightningTrainer`` through
:class:`~agentforge.serving.promoter.GatedPublisher`, the replay jobs and continual mode, which publish the
same way, and the prompt optimiser, whose held-out check is :meth:`EvalGate.judge`). Three rules, each a
small value object that only computes; who runs the evaluations and moves the alias is serving's business
(:mod:`agentforge.serving.promoter`):

* :class:`EvalGate` — a paired comparison on a fixed held-out slice, candidate against the live version on the
  same examples in the same order: the candidate passes only when its mean gain is ``> min_gain`` and, with
  ``max_p``, the one-sided :func:`paired_test` gives ``p <= max_p``; with ``margin`` (the non-inferiority
  gate sized by :func:`agentforge.gate_power.plan_gate`), the lower one-sided ``1 - alpha`` bound of the gain
  lies above ``-margin``.
* :class:`CanaryRule` — live traffic: after ``rollouts`` live rollouts served by the candidate, its mean
  reward must not be below the live version's (over the same period) by more than ``margin``.
* :class:`RollbackRule` — after promotion: once ``window`` live rollouts were served by the new version, it is
  rolled back when its mean reward is below the previous version's reference by more than ``margin``.

Every decision (passed, refused, promoted, rolled back, kept) is a :class:`Decision` stored through the
``TraceStore`` port as a version of the resource ``promotion:{name}`` (kind ``"other"``, never active):
the store numbers decisions like any resource version, every backend keeps them, and
``agentforge versions`` shows them beside the versions they judged (:func:`list_decisions`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any, Literal

from agentforge.errors import ConfigError
from agentforge.ports import TraceStore
from agentforge.types import ResourceVersion

__all__ = [
    "PairedTest",
    "paired_test",
    "EvalGate",
    "EvalResult",
    "judge_versions",
    "CanaryRule",
    "RollbackRule",
    "LiveComparison",
    "Decision",
    "DECISION_PREFIX",
    "record_decision",
    "list_decisions",
]

#: Decisions about resource ``name`` are versions of the resource ``f"{DECISION_PREFIX}{name}"``.
DECISION_PREFIX = "promotion:"

Stage = Literal["eval", "canary", "promote", "watch"]
Outcome = Literal["passed", "refused", "skipped", "promoted", "rolled_back", "kept"]


@dataclass(frozen=True)
class PairedTest:
    """A one-sided paired test of ``after > before`` on the same examples (see :func:`paired_test`).

    Attributes:
        n: examples compared.
        mean_diff: mean of ``after - before`` (for exact-match rewards: the accuracy gain).
        std_err: standard error of ``mean_diff`` (sample standard deviation / sqrt(n)).
        wins: examples where ``after`` scored higher; ``losses``: where ``before`` did.
        p_value: one-sided p-value of "no difference" against "after is better", in (0, 1].
        method: ``"exact sign test"`` (every non-zero difference has the same size, e.g. 0/1 rewards:
            the exact McNemar test) or ``"sign-flip permutation (R resamples)"``.
    """

    n: int
    mean_diff: float
    std_err: float
    wins: int
    losses: int
    p_value: float
    method: str


def paired_test(
    before: Sequence[float], after: Sequence[float], *, resamples: int = 20_000, seed: int = 0
) -> PairedTest:
    """One-sided paired test that ``after`` scores higher than ``before`` on the same examples.

    Under the null hypothesis each per-example difference ``d_i = after_i - before_i`` is as likely to
    have either sign (Fisher's sign-flip randomisation test, Good 2005, "Permutation, Parametric and
    Bootstrap Tests of Hypotheses", ch. 3). When every non-zero ``|d_i|`` is equal (0/1 exact-match
    rewards) the test is exact: ``p = P(Binomial(wins + losses, 1/2) >= wins)``, the exact one-sided sign
    test (Conover 1999, "Practical Nonparametric Statistics", 3rd ed., §3.4; the same number as
    ``scipy.stats.binomtest(wins, wins + losses, 0.5, alternative="greater").pvalue``), computed here with
    :func:`math.comb` so the core needs no SciPy.

    Args:
        before: per-example scores of the baseline (the live version, the seed), ``N`` of them.
        after: per-example scores of the challenger on the same examples, same order.
        resamples: random sign flips for the general case.
        seed: random seed of the resampling (the result is deterministic for a given seed).

    Returns:
        The :class:`PairedTest`; ``p_value`` is 1.0 when no example differs.

    Raises:
        ConfigError: the sequences are empty or differ in length, or ``resamples < 1``.
    """
    if not before or len(before) != len(after) or resamples < 1:
        raise ConfigError(
            f"paired_test needs two equally long, non-empty score lists and resamples >= 1; got "
            f"{len(before)} and {len(after)} scores, resamples={resamples}"
        )
    diffs = [float(a) - float(b) for b, a in zip(before, after, strict=True)]
    n, mean = len(diffs), sum(diffs) / len(diffs)
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    nonzero = [d for d in diffs if d != 0.0]
    wins, losses = sum(d > 0 for d in nonzero), sum(d < 0 for d in nonzero)
    if not nonzero:
        p, method = 1.0, "exact sign test"
    elif len({abs(d) for d in nonzero}) == 1:
        m = len(nonzero)
        p, method = sum(math.comb(m, k) for k in range(wins, m + 1)) / 2**m, "exact sign test"
    else:
        rng, observed = random.Random(seed), sum(nonzero)
        hits = sum(
            sum(d if rng.random() < 0.5 else -d for d in nonzero) >= observed - 1e-12
            for _ in range(resamples)
        )
        p, method = (1 + hits) / (1 + resamples), f"sign-flip permutation ({resamples} resamples)"
    return PairedTest(n, mean, math.sqrt(var / n), wins, losses, p, method)


@dataclass(frozen=True)
class EvalResult:
    """What :meth:`EvalGate.judge` found.

    Attributes:
        passed: the candidate may go on (to the canary).
        live_mean, candidate_mean: mean score of each over the slice (reward units, e.g. accuracy in [0, 1]).
        gain: ``candidate_mean - live_mean``.
        test: the paired test (always computed; it decides only when the gate has ``max_p``).
        reason: one sentence with the numbers.
    """

    passed: bool
    live_mean: float
    candidate_mean: float
    gain: float
    test: PairedTest
    reason: str

    def evidence(self) -> dict[str, Any]:
        """The numbers as a JSON-ready dict (what the decision record stores)."""
        return {k: v for k, v in asdict(self).items() if k != "passed"}


@dataclass(frozen=True)
class EvalGate:
    """A paired comparison on a fixed held-out slice, candidate against the live version.

    Two rules, alone or together:

    * **significance** (``max_p``): the one-sided :func:`paired_test` must give ``p <= max_p``. On a small
      slice this cannot say yes to a good candidate with a single loss (DESIGN fact 11);
    * **non-inferiority** (``margin``): the lower one-sided ``1 - alpha`` normal bound of the mean gain,
      ``gain - z_{1-alpha} * std_err``, must lie above ``-margin``. Sized with
      :func:`agentforge.gate_power.plan_gate`, a ``+margin`` candidate passes with the planned power and a
      ``-margin`` one is refused with ``1 - alpha`` (:meth:`sized` builds it).

    Args:
        max_p: bound on the one-sided p-value; ``None``: no significance test is required (it is still
            computed and stored).
        min_gain: the candidate's mean must exceed the live version's by more than this (reward units).
        resamples: sign flips of the permutation test for graded (non 0/1) scores.
        margin: the non-inferiority margin (reward units, e.g. 0.05); ``None``: no bound is required.
        alpha: one-sided level of the non-inferiority bound, in (0, 0.5).

    Raises:
        ConfigError: ``max_p`` outside (0, 1], ``margin`` outside (0, 1) or ``alpha`` outside (0, 0.5).
    """

    max_p: float | None = 0.05
    min_gain: float = 0.0
    resamples: int = 20_000
    margin: float | None = None
    alpha: float = 0.05

    def __post_init__(self) -> None:
        if self.max_p is not None and not 0.0 < self.max_p <= 1.0:
            raise ConfigError(f"EvalGate: max_p={self.max_p} must be in (0, 1] (or None for no test)")
        if self.margin is not None and not (0.0 < self.margin < 1.0 and 0.0 < self.alpha < 0.5):
            raise ConfigError(
                f"EvalGate: margin={self.margin} must be in (0, 1) (or None) and alpha={self.alpha} in (0, 0.5)"
            )

    @classmethod
    def sized(cls, effect: float = 0.05, *, alpha: float = 0.05, min_gain: float = 0.0) -> EvalGate:
        """The non-inferiority gate for ``effect`` (no significance test): score it on
        ``plan_gate(effect, alpha=alpha, ...).n`` tasks for the planned power.

        Raises:
            ConfigError: ``effect`` outside (0, 1) or ``alpha`` outside (0, 0.5).
        """
        return cls(max_p=None, min_gain=min_gain, margin=effect, alpha=alpha)

    def lower_bound(self, test: PairedTest) -> float:
        """The lower one-sided ``1 - alpha`` normal bound of the mean gain (reward units)."""
        return test.mean_diff - NormalDist().inv_cdf(1 - self.alpha) * test.std_err

    def judge(self, live: Sequence[float], candidate: Sequence[float], *, seed: int = 0) -> EvalResult:
        """Decide on per-example scores of the live version and the candidate (same examples, same order).

        Args:
            live: the live version's scores, ``N`` of them.
            candidate: the candidate's scores on the same ``N`` examples.
            seed: seed of the permutation test (graded scores only).

        Returns:
            The :class:`EvalResult`; ``passed`` needs ``gain > min_gain`` and, with ``max_p``,
            ``p <= max_p``.

        Raises:
            ConfigError: the score lists are empty or differ in length.
        """
        test = paired_test(live, candidate, resamples=self.resamples, seed=seed)
        live_mean, cand_mean = sum(live) / len(live), sum(candidate) / len(candidate)
        gain = cand_mean - live_mean
        significant = self.max_p is None or test.p_value <= self.max_p
        bound = self.lower_bound(test)
        not_worse = self.margin is None or bound > -self.margin
        passed = gain > self.min_gain and significant and not_worse
        rules = [f"gain > {self.min_gain:g}"]
        if self.max_p is not None:
            rules.append(f"max_p {self.max_p:g}")
        if self.margin is not None:
            rules.append(f"lower {1 - self.alpha:.0%} bound {bound:+.3f} > -{self.margin:g}")
        elif self.max_p is None:
            rules.append("no test required")
        reason = (
            f"gain {gain:+.3f} ({live_mean:.3f} -> {cand_mean:.3f}) on {test.n} gate examples (a fixed slice nothing trains on), "
            f"{test.wins} wins / {test.losses} losses, p = {test.p_value:.3g} ({test.method}); "
            f"needs " + " and ".join(rules)
        )
        return EvalResult(passed, live_mean, cand_mean, gain, test, reason)


def judge_versions(
    gate: EvalGate,
    evaluate: Callable[[str], Sequence[float]],
    candidate: str,
    live: str,
    scores: MutableMapping[str, list[float]],
) -> tuple[EvalResult, dict[str, Any]]:
    """The eval gate's step for one candidate: score both versions on the fixed slice and judge.

    Args:
        gate: the rule.
        evaluate: ``evaluate(version) -> scores``, one per example of the slice, same order every call.
        candidate, live: the versions compared.
        scores: version → its slice scores, read and updated: the slice is fixed, so a version is scored once
            (the live one usually was, as the previous candidate).

    Returns:
        ``(result, evidence)``: the :class:`EvalResult` and the numbers a decision record stores (the result's
        evidence, both score lists and the gate's bounds).

    Raises:
        Whatever ``evaluate`` raises.
    """
    live_scores = scores.get(live) or [float(x) for x in evaluate(live)]
    cand_scores = [float(x) for x in evaluate(candidate)]
    scores.update({live: live_scores, candidate: cand_scores})
    result = gate.judge(live_scores, cand_scores)
    evidence = {
        **result.evidence(),
        "live_scores": live_scores,
        "candidate_scores": cand_scores,
        "max_p": gate.max_p,
        "min_gain": gate.min_gain,
        "margin": gate.margin,
        "alpha": gate.alpha,
        "lower_bound": gate.lower_bound(result.test),
    }
    return result, evidence


@dataclass(frozen=True)
class LiveComparison:
    """Live rewards of two versions over one period, and what a rule made of them.

    Attributes:
        passed: the rule holds (canary: the candidate may be promoted; watch: the version stays).
        version_n, version_mean: live rollouts served by the judged version, and their mean reward.
        reference_n, reference_mean: the same for the version it is compared with.
        margin: the allowed shortfall (reward units).
        reason: one sentence with the numbers.
    """

    passed: bool
    version_n: int
    version_mean: float
    reference_n: int
    reference_mean: float
    margin: float
    reason: str

    def evidence(self) -> dict[str, Any]:
        """The numbers as a JSON-ready dict (what the decision record stores)."""
        return {k: v for k, v in asdict(self).items() if k != "passed"}


def _compare(
    version: Sequence[float],
    reference: Sequence[float],
    margin: float,
    what: str,
    need: int,
    need_reference: int = 0,
) -> LiveComparison:
    """``passed`` when ``version`` has at least ``need`` rewards, ``reference`` at least ``need_reference``,
    and ``version``'s mean is not below ``reference``'s by more than ``margin`` (an empty reference, where
    allowed, cannot be fallen behind)."""
    v_mean = sum(version) / len(version) if version else math.nan
    r_mean = sum(reference) / len(reference) if reference else math.nan
    counts = len(version) >= need and len(reference) >= need_reference
    ok = counts and (not reference or v_mean >= r_mean - margin)
    reason = (
        f"{what}: mean live reward {v_mean:.3f} over {len(version)} rollouts (needs {need}) vs "
        f"{r_mean:.3f} over {len(reference)} (needs {need_reference}); allowed shortfall {margin:g}"
    )
    return LiveComparison(ok, len(version), v_mean, len(reference), r_mean, margin, reason)


@dataclass(frozen=True)
class CanaryRule:
    """Serve ``share`` of live rollouts (by rollout id, sticky) with the candidate until both it and the live
    version have served ``rollouts`` of them in the same period, then compare their mean live rewards.

    Args:
        share: fraction of live rollouts the candidate serves, in (0, 1).
        rollouts: live rollouts (with a reward) each arm — candidate and live version — must have served
            before the decision.
        margin: the candidate's mean live reward may be below the live version's by at most this.
        timeout_s: seconds to wait for ``rollouts``; a canary that has not got them by then is refused.

    Raises:
        ConfigError: ``share`` outside (0, 1), ``rollouts < 1``, ``margin < 0`` or ``timeout_s <= 0``.
    """

    share: float = 0.2
    rollouts: int = 20
    margin: float = 0.05
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0.0 < self.share < 1.0 or self.rollouts < 1 or self.margin < 0 or self.timeout_s <= 0:
            raise ConfigError(
                f"CanaryRule: share={self.share} must be in (0, 1), rollouts={self.rollouts} >= 1, "
                f"margin={self.margin} >= 0 and timeout_s={self.timeout_s} > 0"
            )

    def judge(self, candidate: Sequence[float], live: Sequence[float]) -> LiveComparison:
        """Compare the candidate's live rewards with the live version's over the same period.

        Returns:
            ``passed`` when each arm served at least :attr:`rollouts` rollouts and the candidate's mean is at
            least the live mean minus :attr:`margin`.
        """
        return _compare(candidate, live, self.margin, "canary", self.rollouts, self.rollouts)


@dataclass(frozen=True)
class RollbackRule:
    """After promotion, watch ``window`` live rollouts of the new version; roll back if it fell behind.

    Args:
        window: live rollouts of the new version (with a reward) to judge it on.
        margin: rolled back when its mean is below the previous version's reference mean by more than this.
        timeout_s: seconds the watch lasts at most; a window not filled by then keeps the version.

    Raises:
        ConfigError: ``window < 1``, ``margin < 0`` or ``timeout_s <= 0``.
    """

    window: int = 20
    margin: float = 0.05
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.window < 1 or self.margin < 0 or self.timeout_s <= 0:
            raise ConfigError(
                f"RollbackRule: window={self.window} must be >= 1, margin={self.margin} >= 0 and "
                f"timeout_s={self.timeout_s} > 0"
            )

    def judge(self, promoted: Sequence[float], reference: Sequence[float]) -> LiveComparison:
        """``passed`` (keep) unless the promoted version's mean over the window is below the reference mean
        (the previous version's live rewards) by more than :attr:`margin`."""
        return _compare(promoted[: self.window], reference, self.margin, "after promotion", 1)


@dataclass(frozen=True)
class Decision:
    """One promotion decision, as stored (``promotion:{name}`` resource payload).

    Attributes:
        name: the judged resource (``policy``, ``prompt:triage``).
        stage: ``eval``, ``canary``, ``promote`` or ``watch``.
        outcome: ``passed``, ``refused``, ``skipped``, ``promoted``, ``rolled_back`` or ``kept``.
        candidate: the version judged (``policy@v8``; for prompts ``prompt:triage@v3``).
        live: the version it was compared with (the live one; after a rollback, the one served again).
        reason: one sentence with the numbers.
        evidence: the numbers (scores, means, counts, p-value, margins).
        number: the store's number of this decision (0 until stored).
        created_at: when it was stored (epoch seconds).
    """

    name: str
    stage: Stage
    outcome: Outcome
    candidate: str
    live: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    number: int = 0
    created_at: float = 0.0

    def payload(self) -> dict[str, Any]:
        """The stored payload (everything but ``number`` and ``created_at``, which the store keeps)."""
        return {k: v for k, v in asdict(self).items() if k not in ("number", "created_at")}


def record_decision(store: TraceStore, decision: Decision) -> Decision:
    """Store ``decision`` as the next version of ``promotion:{name}`` (never activated).

    Returns:
        The decision with the store's ``number`` and ``created_at``.

    Raises:
        StoreError: the store could not write it.
    """
    stored = store.publish_resource(
        ResourceVersion(name=DECISION_PREFIX + decision.name, kind="other", payload=decision.payload()),
        activate=False,
    )
    return Decision(**{**decision.payload(), "number": stored.version, "created_at": stored.created_at})


def list_decisions(store: TraceStore, name: str | None = None) -> list[Decision]:
    """Stored decisions (about ``name``, or about every resource), oldest first per name.

    Returns:
        One :class:`Decision` per stored record whose payload has the decision fields.
    """
    names = [DECISION_PREFIX + name] if name is not None else None
    records = (
        store.list_resources(names[0])
        if names
        else [r for r in store.list_resources() if r.name.startswith(DECISION_PREFIX)]
    )
    fields = {"name", "stage", "outcome", "candidate", "live", "reason"}
    return [
        Decision(**r.payload, number=r.version, created_at=r.created_at)
        for r in records
        if fields <= set(r.payload)
    ]
