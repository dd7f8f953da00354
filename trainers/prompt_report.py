"""What a prompt-optimisation run produced: :class:`PromptCandidate`, :class:`PromptOptResult` and its table,
and :func:`paired_test`, the significance check that decides whether the winner really beats the seed.

Kept apart from :mod:`agentforge.trainers.prompt_opt` (the GEPA loop) so results can be loaded, printed
and compared without ``gepa`` installed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from agentforge.errors import ConfigError

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["PairedTest", "paired_test", "PromptCandidate", "PromptOptResult"]


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
    rewards) the test is exact: ``p = P(Binomial(wins + losses, 1/2) >= wins)``, the exact one-sided
    McNemar test. Otherwise ``p = (1 + #{resampled sum >= observed sum}) / (1 + resamples)``.

    Args:
        before: per-example scores of the baseline (the seed), ``N`` of them.
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


@dataclass
class PromptCandidate:
    """One candidate GEPA accepted into its pool (index 0 is the seed).

    Attributes:
        index: GEPA's candidate index.
        version: the prompt version that holds its text.
        template: the text.
        val_score: mean reward on the validation set, in [0, 1] for exact-match rewards.
        parents: indices of the candidates it was derived from (two for a merge).
        discovered_at: rollouts spent when it was found.
        test_score: mean reward on the held-out test set, when evaluated.
    """

    index: int
    version: int
    template: str
    val_score: float
    parents: list[int] = field(default_factory=list)
    discovered_at: int = 0
    test_score: float | None = None


@dataclass
class PromptOptResult:
    """The outcome of :func:`~agentforge.trainers.prompt_opt.optimize_prompt`.

    Attributes:
        name: the prompt's resource name.
        seed_version: the version holding the seed text.
        candidates: GEPA's accepted candidates, seed first.
        best_index: the candidate with the best validation mean.
        activated_version: the version activated (the winner), or ``None`` when it did not beat the seed.
        decided_on: ``"test"`` (held-out set) or ``"val"``: the scores the decision compared.
        budget: the rollout budget; ``rollouts_used``: spent on optimisation (<= budget);
            ``extra_rollouts``: the held-out evaluations; ``failed_rollouts``: rollouts scored 0.0 because
            they failed or had no reward.
        evaluated: per version evaluated (including proposals GEPA rejected): ``(rollouts, mean reward)``.
        templates: the text of every evaluated version.
        reflection_calls: the reflection LM's calls (``output``, ``latency_s``, ``error``).
        gepa_log: GEPA's log lines.
        wall_s: wall-clock seconds of the whole run.
        significance: the paired test of winner against seed on the ``decided_on`` examples (``None``
            when the winner is the seed).
        max_p: the p-value the winner had to reach to be activated (``None``: no significance required).
    """

    name: str
    seed_version: int
    candidates: list[PromptCandidate]
    best_index: int
    activated_version: int | None
    decided_on: str
    budget: int
    rollouts_used: int
    extra_rollouts: int = 0
    failed_rollouts: int = 0
    evaluated: dict[int, tuple[int, float]] = field(default_factory=dict)
    templates: dict[int, str] = field(default_factory=dict)
    reflection_calls: list[dict[str, Any]] = field(default_factory=list)
    gepa_log: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    significance: PairedTest | None = None
    max_p: float | None = None

    @property
    def best(self) -> PromptCandidate:
        """The winner (best validation mean; the seed when nothing beat it)."""
        return self.candidates[self.best_index]

    @property
    def seed(self) -> PromptCandidate:
        """The seed candidate."""
        return self.candidates[0]

    @property
    def improved(self) -> bool:
        """Whether a new version was activated."""
        return self.activated_version is not None

    def table(self, width: int = 70) -> Table:
        """A rich table of the candidates: version, parents, val (and test) score, text (cut to ``width``)."""
        from rich.table import Table

        title = f"GEPA candidates for {self.name} ({self.rollouts_used}/{self.budget} rollouts)"
        table = Table(title=title)
        for col in ("#", "version", "parents", "found at", "val", "test", "prompt"):
            table.add_column(col, justify="left" if col == "prompt" else "right")
        for c in self.candidates:
            text = c.template.replace("\n", " ")
            mark = " ★" if c.index == self.best_index else ""
            table.add_row(
                f"{c.index}{mark}", f"v{c.version}", ",".join(map(str, c.parents)) or "-", str(c.discovered_at),
                f"{c.val_score:.3f}", "-" if c.test_score is None else f"{c.test_score:.3f}",
                text if len(text) <= width else text[: width - 1] + "…",
            )  # fmt: skip
        return table

    def summary(self) -> str:
        """One line: what was activated, compared on which scores."""
        best, seed = self.best, self.seed
        score = "test_score" if self.decided_on == "test" else "val_score"
        a, b = getattr(seed, score), getattr(best, score)
        sig = self.significance
        test = (
            ""
            if sig is None
            else f" (paired: +{sig.wins}/-{sig.losses} of {sig.n}, one-sided p={sig.p_value:.3g})"
        )
        if self.improved:
            return (
                f"activated {self.name} v{self.activated_version}: {self.decided_on} {a:.3f} → {b:.3f}{test}"
            )
        return (
            f"kept the active version: the best candidate (v{best.version}) did not beat the seed on "
            f"{self.decided_on} ({b:.3f} vs {a:.3f}){test}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (``evaluated``/``templates`` keyed by version as a string)."""
        out = asdict(self)
        out["evaluated"] = {str(k): list(v) for k, v in self.evaluated.items()}
        out["templates"] = {str(k): v for k, v in self.templates.items()}
        return out
