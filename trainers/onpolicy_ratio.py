"""The importance-sampling ratio from the training forward: no separate old-policy pass when it equals it.

TRL's ``GRPOTrainer`` corrects for the train/serve mismatch (``vllm_importance_sampling_correction``,
which agentforge turns on against the engine's stored logprobs, :func:`~agentforge.trainers.trl_private.
use_engine_logprobs`) with the ratio ``exp(old − stored)``, where ``old`` is the policy's log-probability
at the weights that will be trained. To have it before the loss, TRL runs a whole extra no-grad forward over
the generation batch (``old_per_token_logps``). When the batch is generated at the first micro-step of an
optimizer step and used up before the next one (``gradient_accumulation_steps`` a multiple of
``steps_per_generation × num_iterations``; :class:`~agentforge.trainers.grpo_config.TrainConfig` always sets
``steps_per_generation = gradient_accumulation_steps``, so this holds whenever ``num_iterations == 1``), those
weights are exactly the weights of the training forward, and TRL itself then uses
``per_token_logps.detach()`` as ``old`` (``GRPOTrainer._compute_loss``). Only the engine correction makes it
run the extra pass, which on CPU costs about as much as the training forward without its backward.

:class:`TrainingForwardRatio` skips that pass in exactly that case and computes the ratio from the training
forward's detached log-probabilities, in the same micro-batch, with TRL's formula (token or sequence level,
``truncate`` or ``mask`` mode, NaN stored logprobs count as ratio 1). The loss is unchanged up to
floating-point rounding (and LoRA dropout, which draws new masks in every forward either way). The metrics TRL
logs with the ratio (``sampling/sampling_logp_difference/*``, ``sampling/importance_sampling_ratio/*``) and
agentforge's raw ratio (:func:`~agentforge.trainers.engine_logps.raw_ratio_metrics`) are logged per
micro-batch instead of per generation batch; TRL averages every metric over the logging window either way.

It overrides private TRL methods (``_generate_and_score_completions``, ``_compute_loss``,
``_get_per_token_logps_and_entropies``) and relies on ``_compute_loss`` computing the policy's log-probs
before it reads ``inputs["importance_sampling_ratio"]``, so it checks the tested TRL release first
(:func:`~agentforge.trainers.trl_private.check_trl_version`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from agentforge.trainers.engine_logps import raw_ratio_metrics
from agentforge.trainers.trl_private import check_trl_version

__all__ = ["TrainingForwardRatio", "importance_ratio"]

_RATIO = "importance_sampling_ratio"


def importance_ratio(
    old: torch.Tensor,
    stored: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """TRL's capped train/serve importance ratio ``exp(old − stored)`` (``vllm_importance_sampling_mode``).

    Args:
        old: the policy's log-probabilities, ``(B, C)``.
        stored: the engine's, ``(B, C)`` (NaN where it gave none: ratio 1 there).
        mask: 1 on tokens the policy sampled, ``(B, C)``.
        mode: ``token_truncate``, ``token_mask``, ``sequence_truncate`` or ``sequence_mask``.
        clip_min: the lower cap (``None``: none).
        clip_max: the upper cap (``None``: none).

    Returns:
        ``(B, C)`` for token modes, ``(B, 1)`` for sequence modes; ``truncate`` clamps to the caps, ``mask``
        sets ratios outside them to 0.

    Raises:
        ValueError: an unknown ``mode``.
    """
    diff = torch.nan_to_num((old - stored) * mask, nan=0.0)
    level, _, how = mode.partition("_")
    if level not in ("token", "sequence") or how not in ("truncate", "mask"):
        raise ValueError(f"unknown vllm_importance_sampling_mode {mode!r}")
    ratio = torch.exp(diff.sum(dim=-1, keepdim=True) if level == "sequence" else diff)
    if how == "truncate":
        no_cap = clip_min is None and clip_max is None
        return ratio if no_cap else torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


class TrainingForwardRatio:
    """Mixin for ``trl.GRPOTrainer``: the engine correction's ratio from the training forward (module docstring).

    ``old_pass_skips`` counts the generation batches whose old-policy pass was skipped.
    """

    old_pass_skips = 0
    _ratio_inputs: dict[str, Any] | None = None

    def _ratio_from_training_forward(self) -> bool:
        args = self.args  # type: ignore[attr-defined]
        generate_every = args.steps_per_generation * self.num_iterations  # type: ignore[attr-defined]
        return bool(
            getattr(self, "use_vllm", False)
            and self.vllm_importance_sampling_correction
            and args.gradient_accumulation_steps % generate_every == 0
        )

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        if not self._ratio_from_training_forward():
            return super()._generate_and_score_completions(inputs)  # type: ignore[misc, no-any-return]
        check_trl_version("GRPOTrainer._compute_loss's importance_sampling_ratio (TrainingForwardRatio)")
        self.vllm_importance_sampling_correction = False  # TRL then skips the old pass and the ratio
        try:
            out = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        finally:
            self.vllm_importance_sampling_correction = True
        self.old_pass_skips += 1
        return out

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        if _RATIO in inputs or not self._ratio_from_training_forward():
            return super()._compute_loss(model, inputs)  # type: ignore[misc]
        inputs = dict(inputs)  # filled with the ratio by the policy's log-prob pass below
        self._ratio_inputs = inputs
        try:
            return super()._compute_loss(model, inputs)  # type: ignore[misc]
        finally:
            self._ratio_inputs = None

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D401 - TRL's
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)  # type: ignore[misc]
        inputs, self._ratio_inputs = self._ratio_inputs, None  # the first pass in _compute_loss: the policy's
        if inputs is not None:
            inputs[_RATIO] = self._ratio_and_metrics(out[0].detach(), inputs)
        return out

    def _ratio_and_metrics(self, old: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
        """TRL's ratio for this micro-batch, logging the metrics TRL logs with it."""
        from trl.trainer.utils import nanmax, nanmin

        stored = inputs["sampling_per_token_logps"]
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        mode = self.vllm_importance_sampling_mode  # type: ignore[attr-defined]
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max  # type: ignore[attr-defined]
        ratio = importance_ratio(old, stored, mask, mode, low, high)
        gather = self.accelerator.gather  # type: ignore[attr-defined]
        metrics = self._metrics["train" if self.model.training else "eval"]  # type: ignore[attr-defined]
        real = mask.bool()
        delta = torch.abs(old - stored)[real & ~torch.isnan(stored)]
        zero = old.new_zeros(())
        metrics["sampling/sampling_logp_difference/mean"].append(
            gather(delta.mean() if delta.numel() else zero).mean().item()
        )
        metrics["sampling/sampling_logp_difference/max"].append(
            gather(delta.max() if delta.numel() else zero).max().item()
        )
        flat = ratio.flatten() if mode.startswith("sequence") else ratio[real]
        prefix = "sampling/importance_sampling_ratio"
        metrics[f"{prefix}/min"].append(nanmin(gather(flat.min() if flat.numel() else zero)).item())
        metrics[f"{prefix}/mean"].append(gather(flat.mean() if flat.numel() else zero).nanmean().item())
        metrics[f"{prefix}/max"].append(nanmax(gather(flat.max() if flat.numel() else zero)).item())
        for key, value in raw_ratio_metrics(old, stored, mask).items():
            metrics[key].append(value)
        return ratio
