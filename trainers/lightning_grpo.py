"""The ``trl.GRPOTrainer`` class the lightning trainer builds: TRL's, plus the overrides its contracts need.

:func:`lightning_trainer_class` composes, over ``trl.GRPOTrainer`` (or :class:`~agentforge.trainers.prefix.
SharedPrefixGRPOTrainer` when prompts are shared):

* :class:`EpochSeededSampling` — **a resume draws the data the uninterrupted run draws.** TRL's
  ``RepeatSampler`` seeds one ``torch.Generator`` when it is built and advances it with every pass over the
  dataset, so a run resumed in epoch ``e`` (a new sampler) draws epoch 0's order again, not epoch ``e``'s, and
  nothing warns. Here the sampler re-seeds from ``seed + epoch`` whenever ``transformers`` sets the epoch
  (``DataLoader.set_epoch``, called before every epoch, the resumed one included), so epoch ``e``'s order
  depends on ``(seed, e)`` only; ``transformers`` then skips the batches of the resumed epoch already trained.
* :class:`~agentforge.trainers.engine_logps.SpanTemperatures` — every span's log-probabilities are
  recomputed under the temperature its stored ones were computed at (:mod:`agentforge.trainers.engine_logps`).
* :class:`~agentforge.trainers.onpolicy_ratio.TrainingForwardRatio` — when the old policy is the trained one
  (``num_iterations == 1``), the engine correction's importance ratio comes from the training forward instead
  of TRL's separate old-logprob pass (:mod:`agentforge.trainers.onpolicy_ratio`).
* :class:`AdvantageShaping` — ``TrainConfig.negative_advantage_scale`` scales the negative advantages
  TRL computed, and ``TrainConfig.success_bonus`` is added to the successes', before the loss sees them.
* :class:`~agentforge.trainers.part_credit.PartCredit` — with ``TrainConfig.part_credit`` each token gets the
  advantage of its span's reward parts (the act call's the tool/argument parts, the reply's the reply part).
* :class:`LearningSignal` — counts the generation batches in which some advantage is non-zero (on any rank), so
  the lightning trainer can refuse to publish an adapter that received no gradient, and logs the share of
  groups with signal (``batch/signal_group_share``).
* :class:`~agentforge.trainers.lineage.LineageOptimizer` — the optimizer starts from the state saved
  beside ``init_adapter`` (Adam's moments of the lineage), through ``transformers``' documented override point
  ``Trainer.create_optimizer``.

All but the last override private TRL / ``transformers`` methods, so the class checks the tested TRL release first
(:func:`~agentforge.trainers.trl_private.check_trl_version`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from agentforge.trainers.trl_private import check_trl_version, log_step_metrics

__all__ = [
    "SIGNAL_GROUP_SHARE",
    "AdvantageShaping",
    "EpochSeededSampling",
    "LearningSignal",
    "lightning_trainer_class",
]

#: Metric: the share of a step's groups whose rewards differ (some advantage is not 0).
SIGNAL_GROUP_SHARE = "batch/signal_group_share"


class EpochSeededSampling:
    """Mixin for ``trl.GRPOTrainer``: the train sampler's order is a function of ``(seed, epoch)`` (see above)."""

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        from trl.trainer.utils import RepeatSampler

        sampler = super()._get_train_sampler(dataset)  # type: ignore[misc]
        if type(sampler) is RepeatSampler:
            sampler.__class__ = _EpochSeededRepeatSampler
        return sampler


class LearningSignal:
    """Mixin for ``trl.GRPOTrainer``: ``signal_batches`` counts generation batches with a non-zero advantage.

    GRPO's advantage of a sample is its reward minus its group's mean (scaled by the group's spread; Shao et
    al. 2024, "DeepSeekMath"), so a batch whose every group scored equally has all advantages 0 and, with
    ``beta == 0`` (TRL's default), a zero policy gradient. Each rank sees only its slice of the batch, so the
    flag is summed over the processes (every rank generates together, so the collective cannot hang).

    It also logs ``batch/signal_group_share``: the groups with some non-zero advantage ÷ the groups trained
    (over all ranks; a rank's slice holds whole groups of ``num_generations`` consecutive samples). It is
    ``1 − batch/zero_variance_share`` minus the share of groups with fewer than two valid rewards (those have
    no advantage either).
    """

    signal_batches: int = 0
    batches_scored: int = 0

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        out = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        advantages = out.get("advantages")
        if advantages is not None:
            flag = (advantages != 0).any().to(torch.float32).reshape(1)
            accelerator = self.accelerator  # type: ignore[attr-defined]
            if accelerator.num_processes > 1:
                flag = accelerator.reduce(flag, reduction="sum")
            self.batches_scored += 1
            self.signal_batches += int(float(flag.item()) > 0)
            self._log_signal_groups(advantages)
        return out

    def _log_signal_groups(self, advantages: torch.Tensor) -> None:
        size = int(self.num_generations)  # type: ignore[attr-defined]
        if advantages.numel() == 0 or advantages.numel() % size:
            return
        groups = (advantages.reshape(-1, size) != 0).any(dim=1).to(torch.float32)
        groups = self.accelerator.gather(groups)  # type: ignore[attr-defined]
        log_step_metrics(self, {SIGNAL_GROUP_SHARE: float(groups.mean())})


class AdvantageShaping:
    """Mixin for ``trl.GRPOTrainer``: negative advantages are multiplied by ``args.negative_advantage_scale``,
    and successes get ``args.success_bonus`` added.

    ``advantages``: shape ``(rows,)``, one per sampled completion, as TRL's ``_generate_and_score_completions``
    returns them (group-relative: reward minus the group's mean, over its spread; Shao et al. 2024), or shape
    ``(rows, T)``, one per token, after :class:`~agentforge.trainers.part_credit.PartCredit`. The scale
    (``>= 0``; 1 leaves them as they are) applies after the group statistics, so a group's positive samples
    keep their advantage and its negative ones are pushed down less (0: not at all). A sample's sign never
    changes, so the groups with signal stay the same.

    Then every sample whose reward is ``>= args.success_reward`` gets ``args.success_bonus`` added (a group
    whose samples all succeeded, zero advantage in GRPO, trains as rejection-sampling SFT does; see
    ``TrainConfig.success_bonus``). The rewards are the ones TRL's ``_calculate_rewards`` returned for the
    batch (shape ``(rows over all processes, reward functions)``, summed over the functions with their
    weights); an unscorable sample (every function ``None``, NaN) gets no bonus.
    """

    _batch_rewards: torch.Tensor | None = None

    def _calculate_rewards(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        rewards = super()._calculate_rewards(*args, **kwargs)  # type: ignore[misc]
        self._batch_rewards = rewards
        return rewards

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        self._batch_rewards = None
        out = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        scale = float(getattr(self.args, "negative_advantage_scale", 1.0))  # type: ignore[attr-defined]
        bonus = float(getattr(self.args, "success_bonus", 0.0))  # type: ignore[attr-defined]
        advantages = out.get("advantages")
        if advantages is not None and scale != 1.0:
            advantages = out["advantages"] = torch.where(advantages < 0, advantages * scale, advantages)
        if advantages is not None and bonus > 0 and self._batch_rewards is not None:
            successes = self._local_successes(advantages).to(advantages.dtype)
            if advantages.dim() == 2:  # per token (PartCredit): every token of a success gets the bonus
                successes = successes.unsqueeze(1)
            out["advantages"] = advantages + bonus * successes
        self._batch_rewards = None  # the batch's only: not held across steps
        return out

    def _local_successes(self, advantages: torch.Tensor) -> torch.Tensor:
        """This process's rows (as TRL slices them) whose weighted reward is ``>= args.success_reward``."""
        assert self._batch_rewards is not None
        per_func = self._batch_rewards.to(advantages.device)
        weights = self.reward_weights.to(per_func.device).unsqueeze(0)  # type: ignore[attr-defined]
        unscorable = torch.isnan(per_func).all(dim=1)
        rewards = (per_func * weights).nansum(dim=1)
        success = (rewards >= float(self.args.success_reward)) & ~unscorable  # type: ignore[attr-defined]
        rank, rows = self.accelerator.process_index, advantages.shape[0]  # type: ignore[attr-defined]
        return success[rank * rows : (rank + 1) * rows]


def _epoch_seeded(base: type) -> type:
    class EpochSeededRepeatSampler(base):
        """TRL's ``RepeatSampler`` whose generator is re-seeded from ``seed + epoch`` by ``set_epoch``."""

        def set_epoch(self, epoch: int) -> None:
            """Seed this epoch's order (called by ``accelerate``'s ``DataLoader.set_epoch``)."""
            if self.shuffle and self.seed is not None:
                self.generator.manual_seed(int(self.seed) + int(epoch))

    return EpochSeededRepeatSampler


def _sampler_base() -> type:
    check_trl_version("RepeatSampler / GRPOTrainer._get_train_sampler (overridden by EpochSeededSampling)")
    from trl.trainer.utils import RepeatSampler

    return _epoch_seeded(RepeatSampler)


_EpochSeededRepeatSampler = _sampler_base()


@lru_cache(maxsize=2)
def lightning_trainer_class(share_prompt_prefix: bool = True) -> type:
    """The trainer class :class:`~agentforge.trainers.grpo_trainer.LightningTrainer` builds.

    Args:
        share_prompt_prefix: base it on :class:`~agentforge.trainers.prefix.SharedPrefixGRPOTrainer` (one prompt
            pass per group) instead of ``trl.GRPOTrainer``.

    Returns:
        A ``trl.GRPOTrainer`` subclass with :class:`EpochSeededSampling`, :class:`AdvantageShaping`,
        :class:`~agentforge.trainers.part_credit.PartCredit`, :class:`LearningSignal`,
        :class:`~agentforge.trainers.lineage.LineageOptimizer`,
        :class:`~agentforge.trainers.onpolicy_ratio.TrainingForwardRatio` and
        :class:`~agentforge.trainers.engine_logps.SpanTemperatures`.

    Raises:
        UserError: the installed TRL is not the tested release.
    """
    check_trl_version("GRPOTrainer._get_train_sampler / _get_per_token_logps_and_entropies")
    if share_prompt_prefix:
        from agentforge.trainers.prefix import SharedPrefixGRPOTrainer as base
    else:
        from trl.trainer.grpo_trainer import GRPOTrainer as base
    from agentforge.trainers.engine_logps import SpanTemperatures
    from agentforge.trainers.lineage import LineageOptimizer
    from agentforge.trainers.onpolicy_ratio import TrainingForwardRatio
    from agentforge.trainers.part_credit import PartCredit

    # TrainingForwardRatio before SpanTemperatures: its log-prob hook sees the whole (temperature-scaled) pass
    mixins = (
        EpochSeededSampling,
        AdvantageShaping,  # after PartCredit: scales and adds to the per-token advantages too
        PartCredit,
        LearningSignal,  # sees TRL's per-row advantages
        LineageOptimizer,
        TrainingForwardRatio,
        SpanTemperatures,
    )
    return type(f"Lightning{base.__name__}", (*mixins, base), {})
