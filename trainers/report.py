"""Training reports: the reward-curve PNG (matplotlib, headless)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agentforge.errors import MissingExtraError

if TYPE_CHECKING:
    from matplotlib.typing import ColorType

__all__ = ["plot_reward_curves"]


def plot_reward_curves(
    curves: Mapping[str, Sequence[tuple[int, float]]],
    path: str | Path,
    title: str = "Training reward",
    *,
    evals: Mapping[str, Sequence[tuple[int, float]]] | None = None,
    markers: Mapping[str, Sequence[tuple[int, str]]] | None = None,
) -> Path:
    """Plot one reward curve per run (e.g. per seed) and save it as a PNG.

    Args:
        curves: run label → ``[(step, reward), ...]``; NaN rewards (steps with no valid reward) are skipped.
        path: output PNG path (parent folders are created).
        title: figure title.
        evals: evaluation label → ``[(step, score), ...]`` (e.g. held-out success before and after, gate-slice
            scores at each publish), drawn dashed with square markers on the same axis.
        markers: curve label → ``[(step, outcome), ...]`` events (e.g. ``"promoted"``, ``"refused"``), drawn as
            vertical lines in that curve's colour (solid: promoted, dotted: anything else) and listed in the
            legend once per outcome.

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
    fig, ax = plt.subplots(figsize=(11, 4.8) if evals or markers else (9, 4))
    colours: dict[str, ColorType] = {}
    for label, points in curves.items():
        pts = [(s, r) for s, r in points if r is not None and not math.isnan(r)]
        if pts:
            (line,) = ax.plot([s for s, _ in pts], [r for _, r in pts], marker=".", label=label)
            colours[label] = line.get_color()
    for label, points in (evals or {}).items():
        pts = [(s, r) for s, r in points if r is not None and not math.isnan(r)]
        if pts:
            ax.plot(
                [s for s, _ in pts],
                [r for _, r in pts],
                linestyle="--",
                marker="s",
                markersize=4,
                label=label,
            )
    shown: set[str] = set()
    for label, events in (markers or {}).items():
        for step, outcome in events:
            ax.axvline(
                step,
                color=colours.get(label, "grey"),
                alpha=0.5,
                linewidth=1,
                linestyle="-" if outcome == "promoted" else ":",
                label=None if outcome in shown else f"{outcome} (vertical lines)",
            )
            shown.add(outcome)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers: no 1.25 ticks
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward (batch mean) / success")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if curves or evals:  # beside the axes, never over the curves
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
