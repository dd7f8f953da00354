"""Offline GRPO: train the LoRA adapter on groups of rollouts already in the store, generating nothing.

Each GRPO group is the set of stored rollouts that share ``rollout.group_id`` (the runtime gives the ``G``
rollouts of one task a fresh group id, :func:`agentforge.runtime.tasks.enqueue_tasks`). The recipe:

1. :func:`~agentforge.trainers.replay.select.select_traces` picks the rollouts (a :class:`TraceFilter`);
   rollouts without a reward are kept (``require_reward=False``) so they are masked and counted instead
   of silently shrinking their group;
2. the selected records are grouped by ``group_id``; a group with more than ``G = num_generations`` members
   trains on its ``G`` oldest (the rest counted ``over_group_size``), a smaller one is padded with masked
   slots (counted ``missing_member``); a group with fewer than two rewarded members carries no
   group-relative signal and is dropped (counted in :attr:`StoredGroupSource.dropped`);
3. :class:`~agentforge.trainers.grpo_trainer.LightningTrainer` runs TRL's GRPO over the groups: TRL's sampler
   yields every group once per epoch (``num_train_epochs``; ``max_steps`` overrides), ``tasks_per_step``
   groups per optimizer step. Each sample is the rollout's last trajectory with the **engine's stored
   logprobs**, which feed TRL's importance-sampling correction (``vllm_importance_sampling_correction``,
   mode ``sequence_mask`` by default: a sequence whose train/sample ratio exceeds the cap is masked), the
   only correction for the data being off-policy — no staleness limit applies here;
4. at the end the adapter is saved and published once (a new version, hot-swapped by the publisher).

Every sample that does not train is counted per step in :class:`~agentforge.ports.BatchReport`
(``missing_reward``, ``missing_member``, ``no_trainable_tokens``); groups whose rewards are all equal are
counted as ``zero_variance_groups`` (zero advantage).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentforge.errors import UserError
from agentforge.ports import AdapterPublisher, BatchReport, TraceStore
from agentforge.trainers.grpo_config import TrainConfig
from agentforge.trainers.replay.select import TraceFilter, TraceRecord, select_traces
from agentforge.trainers.rollouts import unmatched_logprobs
from agentforge.trainers.samples import (
    GRPO_COLUMNS,
    build_trajectories,
    grpo_sample,
    masked_sample,
    with_token_columns,
)
from agentforge.types import new_id

__all__ = ["StoredGroupSource", "run_offline_grpo"]


class StoredGroupSource:
    """A :class:`~agentforge.ports.SampleSource` over stored GRPO groups (reads, never writes).

    Args:
        groups: group id → its records, e.g. ``select_traces(...).groups()``.
        group_size: ``G`` (TRL's ``num_generations``).
        placeholder_token_id: the token of masked slots.
        skipped: skip counts from the selection, kept for the report (:attr:`selection_skipped`).
        explored: the records were sampled with exploring settings (a hot or ``min_p`` tool decision, a
            greedy reply) on an engine returning raw logprobs: their trajectories are rebuilt to train as
            temperature-1 samples instead of being masked as unmatched
            (:func:`~agentforge.trainers.logprob_match.stored_logprob_temperature`).

    Attributes:
        groups: the trainable groups, each exactly ``G`` slots long (``None`` = masked slot).
        dropped: why groups were left out (``"fewer than 2 rewarded"``).
        over_group_size: records beyond ``G`` in their group, not trained on.
        used: group ids in the order the trainer consumed them (one entry per group per batch).
        reports: one :class:`BatchReport` per batch.
    """

    def __init__(
        self,
        groups: dict[str, list[TraceRecord]],
        group_size: int,
        *,
        placeholder_token_id: int = 0,
        skipped: Counter[str] | None = None,
        explored: bool = False,
    ) -> None:
        self.group_size, self.placeholder, self.explored = group_size, placeholder_token_id, explored
        self.selection_skipped = Counter(skipped or {})
        self.run_id = new_id("run")
        self.reports: list[BatchReport] = []
        self.used: list[str] = []
        self.dropped: Counter[str] = Counter()
        self.over_group_size = 0
        self.groups: dict[str, list[TraceRecord | None]] = {}
        for group_id, records in groups.items():
            ordered = sorted(records, key=lambda r: r.rollout.created_at)
            if sum(r.reward is not None for r in ordered[:group_size]) < 2:
                self.dropped["fewer than 2 rewarded"] += 1
                continue
            self.over_group_size += max(0, len(ordered) - group_size)
            slots: list[TraceRecord | None] = list(ordered[:group_size])
            self.groups[group_id] = slots + [None] * (group_size - len(slots))

    def prompts(self) -> list[str]:
        """The group ids (the training dataset's ``prompt`` column)."""
        return list(self.groups)

    def __call__(self, prompts: Sequence[Any], trainer: Any = None) -> dict[str, list[Any]]:
        """Samples for ``prompts`` (group ids, each repeated ``G`` times consecutively by TRL's sampler).

        Returns:
            TRL's ``rollout_func`` dict (``prompt_ids``, ``completion_ids``, ``logprobs``, ``env_mask``,
            ``reward``, ``rollout_id``, ``version``), one sample per entry of ``prompts``.
        """
        out: dict[str, list[Any]] = {k: [] for k in GRPO_COLUMNS}
        report = BatchReport(rollouts=len(prompts), groups=len(prompts) // self.group_size)
        for start in range(0, len(prompts), self.group_size):
            group_id = str(prompts[start])
            self.used.append(group_id)
            slots = self.groups[group_id]
            rewards = []
            for offset in range(len(prompts[start : start + self.group_size])):
                sample, reason = self._sample(slots[offset], report)
                if reason is not None:
                    report.skipped[reason] += 1
                else:
                    rewards.append(sample["reward"])
                for key in GRPO_COLUMNS:
                    out[key].append(sample[key])
            if len(rewards) >= 2 and max(rewards) == min(rewards):
                report.zero_variance_groups += 1
            report.rewards += rewards
        self.reports.append(report)
        return out

    def _sample(self, record: TraceRecord | None, report: BatchReport) -> tuple[dict[str, Any], str | None]:
        if record is None:
            return with_token_columns(masked_sample(None, self.placeholder), None), "missing_member"
        masked = with_token_columns(masked_sample(record.rollout_id, self.placeholder), None)
        if record.reward is None or not math.isfinite(record.reward):
            return masked, "missing_reward"
        if not record.trajectories or record.trajectories[-1].sampled_tokens == 0:
            return masked, "no_trainable_tokens"
        traj = record.trajectories[-1]
        if self.explored and traj.unmatched:
            traj = build_trajectories(record.spans, explored=True)[-1]
        if unmatched_logprobs(traj, len(self.reports)):
            return masked, "unmatched_logprobs"
        report.extra_trajectories += len(record.trajectories) - 1
        report.split_rollouts += int(len(record.trajectories) > 1)
        report.truncated += int(traj.truncated)
        report.sampled_tokens += traj.sampled_tokens
        report.forced_tokens += traj.forced_tokens
        return grpo_sample(traj, float(record.reward), record.rollout_id, record.parts), None


def run_offline_grpo(
    model_dir: str | Path,
    store: TraceStore,
    flt: TraceFilter,
    config: TrainConfig,
    publisher: AdapterPublisher,
) -> dict[str, Any]:
    """Train GRPO on the stored groups ``flt`` selects and publish the adapter once at the end.

    Args:
        model_dir: base checkpoint directory (the one serving loads).
        store: the trace store holding the groups.
        flt: which rollouts to use (``require_reward`` is turned off so unrewarded members are counted).
        config: :class:`TrainConfig`; ``num_generations`` is the group size ``G``, ``tasks_per_step`` the
            groups per step, ``num_train_epochs`` (or ``max_steps``) how long.
        publisher: publishes the final adapter as a new served version.

    Returns:
        ``{"steps", "versions", "history", "groups", "used", "dropped_groups", "selection_skipped",
        "over_group_size"}``.

    Raises:
        EmptySelectionError: the filter selects nothing; nothing is trained or published.
        UserError: fewer trainable groups than ``tasks_per_step`` (the message has the counts).
    """
    from agentforge.trainers.grpo_trainer import LightningTrainer  # imports torch/TRL: only when training

    selection = select_traces(store, replace(flt, require_reward=False))  # raises EmptySelectionError
    source = StoredGroupSource(
        selection.groups(),
        config.num_generations,
        skipped=selection.skipped,
        placeholder_token_id=0,
        explored=config.explored_samples == "train",
    )
    if len(source.groups) < config.tasks_per_step:
        raise UserError(
            f"offline GRPO found {len(source.groups)} trainable groups of the {len(selection.groups())} "
            f"selected ({dict(source.dropped)}), but one step needs tasks_per_step={config.tasks_per_step}; "
            f"lower tasks_per_step or widen the filter ({selection.summary()})"
        )
    trainer = LightningTrainer(
        model_dir, store, None, config, publisher, source=source, swap_during_training=False
    )
    source.placeholder = trainer.placeholder_token_id
    result = trainer.train()
    return {
        **result,
        "groups": len(source.groups),
        "used": list(source.used),
        "dropped_groups": dict(source.dropped),
        "selection_skipped": dict(source.selection_skipped),
        "over_group_size": source.over_group_size,
    }
