"""Sizing the eval gate from the effect it must detect (DESIGN fact 11: a gate is only as good as its sample).

The promotion gate compares a candidate with the live version on the same ``n`` tasks (paired 0/1 task
success, greedy). The sign test the gate used before needs ``ceil(log2(1/α))`` wins and no losses at ``n =
20``, so it refuses a +20-point candidate with one loss, and it cannot accept anything once the live version
scores ≥ 17/20. The gate is instead sized to two error rates stated as effects:

* a candidate whose true gain is ``+effect`` passes with probability ≥ ``power`` (default 0.80), and
* a candidate whose true gain is ``-effect`` is refused with probability ≥ ``1 - alpha`` (default 0.95).

The rule that meets both is a **non-inferiority test** of the paired difference with margin ``effect``
(Blackwelder 1982, "Proving the null hypothesis in clinical trials", Controlled Clinical Trials 3(4); for
paired proportions Nam 1997, Biometrics 53(4)): pass when the lower one-sided ``1 - alpha`` confidence
bound of the mean gain lies above ``-effect`` (and the gain itself is above the gate's ``min_gain``). With
``d_i = candidate_i - live_i ∈ {-1, 0, 1}``, ``D̂ = mean(d)`` and ``SE = sqrt((p̂_d - D̂²) / n)`` where
``p̂_d`` is the share of tasks on which the two differ (the discordance), the bound is ``D̂ - z_{1-α}·SE``.
Under a true gain ``Δ`` the pass probability is about ``Φ((Δ + effect) / SE - z_{1-α})``, so ``+effect``
passes with ``power`` once ``SE ≤ 2·effect / (z_{1-α} + z_{power})``, i.e.

    n ≥ p_d · (z_{1-α} + z_{power})² / (2·effect)²                                   (Chow et al. 2008,
                                                                                    "Sample Size
                                                                                    Calculations in
                                                                                    Clinical Research", §4.2)

At effect 0.05, α 0.05, power 0.80 and a discordance of 0.10 this is 62 tasks; at 0.20, 124; at 0.30, 186.
The discordance is a property of the two versions (how often they disagree); measure it on real pairs
(``benchmarks/learning.py`` prints it) and size from it. Guessing it too low costs only power: the bound uses
the *observed* standard error, so a ``-effect`` candidate passes with probability at most ``alpha`` whatever
its discordance (at n = 62: 0.035, 0.05, 0.05 and 0.05 for discordance 0.05, 0.1, 0.2 and 0.3; the power at
``+effect`` is then 0.97, 0.81, 0.55 and 0.42). The normal approximation is checked
there too: that benchmark draws tasks with replacement from real per-task scores of adapters of known
quality and prints the measured pass rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from agentforge.errors import ConfigError

__all__ = ["GatePlan", "plan_gate", "pass_probability"]


@dataclass(frozen=True)
class GatePlan:
    """How many paired tasks a gate needs (see :func:`plan_gate`).

    Attributes:
        n: paired tasks to score both versions on.
        effect: the gain (reward units, e.g. 0.05 = five points of task success) to pass with ``power``; a
            loss of the same size is refused with ``1 - alpha``. Also the gate's non-inferiority margin.
        alpha: the largest pass probability of a candidate ``effect`` worse than the live version.
        power: the smallest pass probability of a candidate ``effect`` better.
        discordance: the assumed share of tasks on which the two versions' scores differ, in (0, 1].
    """

    n: int
    effect: float
    alpha: float
    power: float
    discordance: float

    def describe(self) -> str:
        """One sentence with the numbers."""
        return (
            f"{self.n} paired tasks: a +{self.effect:g} candidate passes with ≥ {self.power:.0%}, a "
            f"-{self.effect:g} one is refused with ≥ {1 - self.alpha:.0%} (discordance {self.discordance:g}, "
            f"normal approximation)"
        )


def _z(p: float) -> float:
    return NormalDist().inv_cdf(p)


def plan_gate(
    effect: float = 0.05, *, alpha: float = 0.05, power: float = 0.8, discordance: float = 0.2
) -> GatePlan:
    """The number of paired tasks for the non-inferiority gate (module docstring's formula).

    Args:
        effect: gain to detect and loss to refuse, in (0, 1) (reward units).
        alpha: pass probability allowed for a ``-effect`` candidate, in (0, 0.5).
        power: pass probability wanted for a ``+effect`` candidate, in (0.5, 1).
        discordance: share of tasks where the two versions differ, in (0, 1].

    Returns:
        The :class:`GatePlan`.

    Raises:
        ConfigError: an argument is outside its range.
    """
    if not (0 < effect < 1 and 0 < alpha < 0.5 and 0.5 < power < 1 and 0 < discordance <= 1):
        raise ConfigError(
            f"plan_gate: effect={effect} must be in (0, 1), alpha={alpha} in (0, 0.5), power={power} in "
            f"(0.5, 1) and discordance={discordance} in (0, 1]"
        )
    n = math.ceil(discordance * (_z(1 - alpha) + _z(power)) ** 2 / (2 * effect) ** 2)
    return GatePlan(n, effect, alpha, power, discordance)


def pass_probability(
    gain: float, n: int, *, effect: float, alpha: float, discordance: float, min_gain: float = 0.0
) -> float:
    """The normal approximation of the gate's pass probability for a candidate whose true gain is ``gain``.

    Args:
        gain: true mean gain of the candidate (reward units, in [-1, 1]).
        n: paired tasks.
        effect: the gate's non-inferiority margin.
        alpha: the gate's one-sided level.
        discordance: share of tasks where the two versions differ (``≥ |gain|``).
        min_gain: the gate's other rule, an observed gain above this.

    Returns:
        ``Φ(min((gain + effect) / SE - z_{1-α}, (gain - min_gain) / SE))`` with ``SE = sqrt((discordance -
        gain²) / n)``, in [0, 1]: both rules must hold, and the smaller of the two is the binding one.

    Raises:
        ConfigError: ``n < 1`` or ``discordance < |gain|``.
    """
    if n < 1 or discordance < abs(gain):
        raise ConfigError(
            f"pass_probability: n={n} must be >= 1 and discordance={discordance} >= |gain|={abs(gain)}"
        )
    se = math.sqrt(max(discordance - gain**2, 1e-12) / n)
    return NormalDist().cdf(min((gain + effect) / se - _z(1 - alpha), (gain - min_gain) / se))
