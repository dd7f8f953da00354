"""A sample source that answers every batch with the same stored groups: a GRPO update without an engine.

For tests and benchmarks that drive :class:`~agentforge.trainers.grpo_trainer.LightningTrainer` on fixed
trajectories (``LightningTrainer(..., source=FixedGroups(groups, rewards))``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentforge.ports import BatchReport
    from agentforge.trainers.samples import Trajectory

__all__ = ["FixedGroups"]


class FixedGroups:
    """A :class:`~agentforge.ports.SampleSource` whose groups and rewards never change.

    TRL's sampler repeats each group's prompt ``G`` times in a batch; the ``k``-th copy gets member ``k`` of
    that group and its reward.

    Args:
        groups: group id (the dataset's prompt) → its ``G`` trajectories.
        rewards: group id → the ``G`` rewards, in member order.
        run_id: the source's run id.
    """

    def __init__(
        self,
        groups: Mapping[str, Sequence[Trajectory]],
        rewards: Mapping[str, Sequence[float]],
        run_id: str = "fixed-groups",
    ) -> None:
        self.groups, self.rewards, self.run_id = groups, rewards, run_id
        self.reports: list[BatchReport] = []

    def prompts(self) -> list[str]:
        return list(self.groups)

    def __call__(self, prompts: Sequence[Any], trainer: Any = None) -> dict[str, list[Any]]:
        from agentforge.ports import BatchReport
        from agentforge.trainers.samples import to_rollout_func_output

        seen: dict[str, int] = {}
        trajs, rewards = [], []
        for p in prompts:
            k = seen[p] = seen.get(p, -1) + 1
            trajs.append(self.groups[p][k])
            rewards.append(self.rewards[p][k])
        self.reports.append(BatchReport(groups=len(seen), rewards=rewards))
        return to_rollout_func_output(trajs, rewards)
