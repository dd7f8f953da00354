"""Per-step learning diagnostics: how far each optimizer step moved the trainable weights.

GRPO on a good policy must take small steps (DESIGN fact 10), and whether it does is invisible in the loss: with
one optimizer step per batch the PPO clip never binds, and Adam's first step moves every LoRA weight by about
``±lr`` whatever the gradient. :class:`UpdateSize` measures the step itself, as a ``transformers``
``TrainerCallback`` (TRL's documented hook): it copies the trainable parameters just before the optimizer step
(``on_pre_optimizer_step``, after gradient clipping) and compares them just after it (``on_optimizer_step``):

* ``train/update_norm``: ``‖θ_after − θ_before‖₂`` over all trainable parameters (the LoRA ``A``/``B``
  matrices), in parameter units;
* ``train/update_ratio``: ``‖θ_after − θ_before‖₂ / ‖θ_before‖₂``, the relative size of the step (0 when the
  step moved nothing: no group had signal, ``beta == 0`` and no momentum carried over; ``nan`` if every
  trainable parameter is 0).

Both are added to TRL's metrics (:func:`~agentforge.trainers.trl_private.log_step_metrics`), so they reach
the step's history row, ``metrics.jsonl``, the store's ``trainer.metrics`` span and any ``report_to``. The
other diagnostics of a step are TRL's ``entropy`` (mean per-token entropy of the policy over the trained
tokens, nats), the raw importance ratio's tails (:mod:`~agentforge.trainers.engine_logps`:
``sampling/raw_importance_ratio/{min,p01,p99,max,outside_share}``) and ``batch/signal_group_share``
(:class:`~agentforge.trainers.lightning_grpo.LearningSignal`).

Parameters sharded by DeepSpeed ZeRO-3 or FSDP hold only a slice on each rank; there the norms are those of the
main process's slice.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import TrainerCallback

from agentforge.trainers.trl_private import log_step_metrics

__all__ = ["UPDATE_NORM", "UPDATE_RATIO", "UpdateSize", "update_size"]

#: ``‖Δθ‖₂`` of one optimizer step over the trainable parameters.
UPDATE_NORM = "train/update_norm"
#: ``‖Δθ‖₂ / ‖θ‖₂`` of one optimizer step over the trainable parameters (θ before the step).
UPDATE_RATIO = "train/update_ratio"


def update_size(before: list[torch.Tensor], after: list[torch.Tensor]) -> dict[str, float]:
    """The size of one step from the parameters before and after it.

    Args:
        before: the trainable parameters before the step, any shapes (computed in float64).
        after: the same parameters after it, in the same order and shapes.

    Returns:
        ``{UPDATE_NORM: ‖after − before‖₂, UPDATE_RATIO: ‖after − before‖₂ / ‖before‖₂}`` (``nan`` ratio when
        ``‖before‖₂`` is 0).
    """
    delta_sq = sum(
        (float(((a.double() - b.double()) ** 2).sum()) for a, b in zip(after, before, strict=True)), 0.0
    )
    norm_sq = sum((float((b.double() ** 2).sum()) for b in before), 0.0)
    delta = math.sqrt(delta_sq)
    return {UPDATE_NORM: delta, UPDATE_RATIO: delta / math.sqrt(norm_sq) if norm_sq > 0 else math.nan}


class UpdateSize(TrainerCallback):
    """Logs :data:`UPDATE_NORM` and :data:`UPDATE_RATIO` for every optimizer step (module docstring).

    Args:
        owner: the :class:`~agentforge.trainers.grpo_trainer.LightningTrainer`; its ``trainer`` (the
            ``trl.GRPOTrainer``) receives the metrics, on the main process only.
    """

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self._params: list[torch.Tensor] = []
        self._before: list[torch.Tensor] = []

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if not self.owner.is_main_process:
            return
        self._params = [p for p in kw["model"].parameters() if p.requires_grad]
        self._before = [p.detach().clone() for p in self._params]

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if not self._params:
            return
        metrics = update_size(self._before, [p.detach() for p in self._params])
        self._params, self._before = [], []
        log_step_metrics(self.owner.trainer, metrics)
