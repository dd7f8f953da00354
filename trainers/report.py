"""Training reports: the reward-curve and lineage PNGs (matplotlib, headless)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentforge.errors import MissingExtraError

if TYPE_CHECKING:
    from matplotlib.typing import ColorType

__all__ = ["plot_lineage", "plot_reward_curves"]


def _pyplot(what: str) -> Any:
    """``matplotlib.pyplot`` on the headless Agg backend. Raises: ``MissingExtraError`` (no matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("matplotlib", "train", what) from exc
    return plt


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
    plt = _pyplot("the reward-curve plot")
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


def plot_lineage(
    lineages: Mapping[str, Sequence[Mapping[str, object]]],
    base_score: float,
    path: str | Path,
    title: str = "Held-out success per version",
) -> Path:
    """Plot each run's lineage: every judged candidate's held-out score beside the version it was judged against.

    The x axis is the judgement (0: the base, then each candidate in the order the gate judged it, labelled with
    the phase that made it, e.g. ``"2 grpo 1"``). Per run: a solid line through the score of the version serving
    after each judgement (it moves only on a promotion), a filled circle for a promoted candidate, an open
    circle with a dotted line from its parent's score for a refused one. The legend sits beside the axes.

    Args:
        lineages: run label (e.g. ``"seed 0"``) → its judged candidates in order, each a mapping with ``phase``,
            ``round``, ``outcome`` (``"promoted"`` or ``"refused"``), ``candidate_held_out`` and
            ``parent_held_out`` (success in [0, 1], or ``None`` when not scored).
        base_score: the base policy's held-out success (x = 0).
        path: output PNG path (parent folders are created).
        title: figure title.

    Returns:
        The PNG path.

    Raises:
        MissingExtraError: matplotlib is not installed (``agentforge[train]``).
    """
    plt = _pyplot("the lineage plot")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(11, 4.8))
    ticks: dict[int, str] = {0: "0\nbase"}
    for label, entries in lineages.items():
        xs, served = [0], [base_score]
        (line,) = ax.plot([], [], marker="", label=f"{label}: served version")
        colour = line.get_color()
        for i, e in enumerate(entries, start=1):
            rnd = e.get("round")
            ticks.setdefault(i, f"{i}\n{e.get('phase', '')}" + (f" {rnd}" if rnd else ""))
            cand, parent = e.get("candidate_held_out"), e.get("parent_held_out")
            promoted = e.get("outcome") == "promoted"
            if isinstance(cand, int | float):
                if promoted:
                    ax.plot([i], [cand], marker="o", color=colour, linestyle="")
                else:
                    start = parent if isinstance(parent, int | float) else served[-1]
                    ax.plot([i - 1, i], [start, cand], linestyle=":", color=colour, linewidth=1)
                    ax.plot([i], [cand], marker="o", markerfacecolor="white", color=colour, linestyle="")
            xs.append(i)
            served.append(float(cand) if promoted and isinstance(cand, int | float) else served[-1])
        line.set_data(xs, served)
        line.set_marker(".")
    ax.relim()  # the served lines were filled in after plotting
    ax.autoscale_view()
    ax.plot([], [], marker="o", linestyle="", color="grey", label="promoted candidate")
    ax.plot(
        [], [], marker="o", markerfacecolor="white", linestyle=":", color="grey", label="refused candidate"
    )
    ax.set_xticks(sorted(ticks), [ticks[k] for k in sorted(ticks)], fontsize=8)
    ax.set_xlabel("judgement (the phase that made the candidate)")
    ax.set_ylabel("held-out success")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
