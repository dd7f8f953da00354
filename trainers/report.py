"""Training reports: the reward-curve PNG (matplotlib, headless)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentforge.errors import MissingExtraError

__all__ = ["plot_reward_curves"]


def plot_reward_curves(
    curves: Mapping[str, Sequence[tuple[int, float]]], path: str | Path, title: str = "Training reward"
) -> Path:
    """Plot one reward curve per run (e.g. per seed) and save it as a PNG.

    Args:
        curves: run label → ``[(step, reward), ...]``; NaN rewards (steps with no valid reward) are skipped.
        path: output PNG path (parent folders are created).
        title: figure title.

    Returns:
        The PNG path.

    Raises:
        MissingExtraError: matplotlib is not installed (``agentforge[train]``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("matplotlib", "train", "the reward-curve plot") from exc
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in curves.items():
        pts = [(s, r) for s, r in points if r is not None and not math.isnan(r)]
        if pts:
            ax.plot([s for s, _ in pts], [r for _, r in pts], marker=".", label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward (batch mean)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if curves:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
