"""What an order-bot evaluation measured: each reward part, the tools chosen against the gold tools, trajectories.

Reads finished rollouts of :class:`~.order_bot.OrderDeskAgent` from the store (the parts are the ones the agent
returned with its reward, ``Reward.metadata["parts"]``, :mod:`.rewards.tool_turn`). Used by the main job
(``examples/main_job.py``) and the baseline script (``examples/order_desk_baseline.py``).

**Collapse check.** A policy that learns to call one tool for every message scores that tool's share of the
gold and no more. :func:`collapse_ratio` is the most frequently chosen tool's count divided by its count in the
gold answers: 1.0 when the policy picks it as often as the gold does; the main job's target is ``<= 2``.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentforge.errors import UserError
from agentforge.types import SpanKind

if TYPE_CHECKING:
    from agentforge.ports import TraceStore
    from agentforge.types import Rollout, Span

__all__ = ["PARTS", "summarise_turns", "collapse_ratio"]

#: The reported parts of a tool turn's reward, in report order.
PARTS: tuple[str, ...] = ("tool", "arguments", "reply", "success")


def collapse_ratio(chosen: Mapping[str, int], gold: Mapping[str, int]) -> float:
    """How much more often the policy picks its favourite tool than the gold answers name it.

    Args:
        chosen: tool name → times chosen (``"(none)"`` for no call).
        gold: tool name → times it is the gold tool.

    Returns:
        ``chosen[top] / gold[top]`` for the most frequently chosen tool ``top`` (``inf`` when the gold never
        names it; ``0.0`` when nothing was chosen).
    """
    if not chosen or not sum(chosen.values()):
        return 0.0
    top, n = Counter(chosen).most_common(1)[0]
    return n / gold[top] if gold.get(top) else float("inf")


def summarise_turns(
    store: TraceStore,
    rollouts: Sequence[Rollout],
    trajectories: Callable[[list[Span]], int] | None = None,
) -> dict[str, Any]:
    """Per-part means, tool choices and trajectory counts of finished order-bot rollouts.

    Args:
        store: the trace store.
        rollouts: finished rollouts of :class:`~.order_bot.OrderDeskAgent` (tasks with ``metadata["gold_tool"]``).
        trajectories: counts the trajectories of a rollout's LLM spans (e.g. ``len(build_trajectories(spans))``
            from :mod:`agentforge.trainers.samples`); ``None`` leaves ``one_trajectory_share`` out.

    Returns:
        ``{"n", "states", "parts": {part: mean}, "reward", "scores", "tools_chosen", "tools_gold",
        "collapse_ratio", "llm_calls", "flags", "groups_with_spread"}`` and ``"one_trajectory_share"``; ``scores`` is
        each rollout's ``success`` (0/1) in order; a rollout without a reward counts 0 in every part;
        ``groups_with_spread`` is the share of task groups whose rewards are not all equal (GRPO learns from
        those).

    Raises:
        UserError: no rollouts.
    """
    if not rollouts:
        raise UserError("summarise_turns needs at least one rollout")
    parts: dict[str, list[float]] = {p: [] for p in PARTS}
    rewards: list[float] = []
    chosen: Counter[str] = Counter()
    gold: Counter[str] = Counter()
    calls: Counter[int] = Counter()
    flags: Counter[str] = Counter()
    single = 0
    for rollout in rollouts:
        final = store.final_reward(rollout.rollout_id)
        got = (final.metadata.get("parts") or {}) if final is not None else {}
        for p in PARTS:
            parts[p].append(float(got.get(p) or 0.0))
        rewards.append(float(final.value or 0.0) if final is not None else 0.0)
        spans = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm)
        calls[len(spans)] += 1
        first = spans[0].llm if spans else None
        chosen[first.tool_calls[0].name if first and first.tool_calls else "(none)"] += 1
        gold[str(rollout.task.metadata["gold_tool"])] += 1
        flags.update(f for s in spans for f in (s.llm.flags if s.llm else []))
        single += trajectories is not None and bool(spans) and trajectories(spans) == 1
    groups: dict[str, list[float]] = {}
    for rollout, reward in zip(rollouts, rewards, strict=True):
        groups.setdefault(rollout.group_id or rollout.rollout_id, []).append(reward)
    n = len(rollouts)
    return {
        "n": n,
        "states": dict(Counter(r.state.value for r in rollouts)),
        "parts": {p: statistics.mean(v) for p, v in parts.items()},
        "reward": statistics.mean(rewards),
        "scores": parts["success"],
        "tools_chosen": dict(chosen),
        "tools_gold": dict(gold),
        "collapse_ratio": collapse_ratio(chosen, gold),
        "llm_calls": dict(calls),
        "flags": dict(flags),
        **({"one_trajectory_share": single / n} if trajectories is not None else {}),
        "groups_with_spread": sum(len(set(g)) > 1 for g in groups.values()) / len(groups),
    }
