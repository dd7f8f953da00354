"""What a prompt-optimisation run produced: :class:`PromptCandidate`, :class:`PromptOptResult` and its table,
and :func:`paired_test` (re-exported from :mod:`agentforge.gate`, the promotion gate every publisher shares),
the significance check that decides whether the winner really beats the seed.

Kept apart from :mod:`agentforge.trainers.prompt_opt` (the GEPA loop) so results can be loaded, printed
and compared without ``gepa`` installed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from agentforge.gate import PairedTest, paired_test

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["PairedTest", "paired_test", "PromptCandidate", "PromptOptResult"]


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
                f"{c.index}{mark}",
                f"v{c.version}",
                ",".join(map(str, c.parents)) or "-",
                str(c.discovered_at),
                f"{c.val_score:.3f}",
                "-" if c.test_score is None else f"{c.test_score:.3f}",
                text if len(text) <= width else text[: width - 1] + "…",
            )
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
        if self.decided_on == "val" and best is not seed and b is not None and a is not None and b > a:
            return (
                f"kept the active version: the best candidate (v{best.version}) beat the seed on val "
                f"({a:.3f} → {b:.3f}){test}, the scores that selected it; held-out tasks (testset, --test-tasks) "
                "decide activation"
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
