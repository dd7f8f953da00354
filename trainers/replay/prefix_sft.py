"""Replay SFT with each batch's shared prompt head run once: ``trl.SFTTrainer`` on shared-prefix passes.

Replay SFT trains on stored trajectories (:mod:`agentforge.trainers.replay.sft_trainer`): ``prompt + completion``
rows whose loss covers the tokens the policy sampled. An agent's prompts share a long head (system prompt,
tool schemas, worked examples; the order bot's are ~490 of ~600 tokens), so TRL's per-row pass computes that
head, forward and backward, once per row. :class:`SharedPrefixSFTTrainer` rearranges each batch into prompts
(every token before a row's first loss token) and completions (the rest: sampled tokens, and tool results or
user turns the policy attends to without loss) and scores the completions with
:func:`~agentforge.trainers.prefix.shared_prefix_forward`: the common head of all prompts runs once, then each
distinct prompt's tail, then every completion against the repeated KV cache (Prefix Grouper, Liu et al.
2025, arXiv:2506.05433). Gradients flow through the cache, so the loss and its gradients equal TRL's per-row
pass up to floating-point rounding.

**The loss is TRL's.** ``SFTTrainer.compute_loss`` (TRL 1.16) calls ``model(**inputs, fused_lm_head=True)``
once and builds everything from the returned per-token fields, which it only sums: the NLL
``-log_probs.sum() / N`` with ``N = num_items_in_batch`` when the ``Trainer`` passes it (the loss tokens of
the whole optimizer step, all gradient-accumulation micro-batches, counted on the shifted labels; the
``Trainer`` then does not divide by the accumulation steps again) or else the micro-batch's own loss tokens
(``label_mask.sum()``); the ``dft`` loss type; the entropy and ``mean_token_accuracy`` metrics. Here that one
call is answered by the shared-prefix pass, whose fields hold the same values at the same tokens (shape
``(B, C)`` instead of ``(B, T - 1)``), so TRL's normalisation and metrics apply unchanged.

Falls back to TRL's own pass (counted in ``fallback_calls``) when there is nothing to share (one row, or
distinct prompts without a common head of :data:`~agentforge.trainers.prefix.MIN_HEAD_TOKENS`), when a row
has no loss token or is not right-padded (padding-free or packed batches), for the gradient pass under
gradient checkpointing (checkpointed layers drop KV caches), and whenever TRL's loss needs the full logits
(``compute_loss_func``, label smoothing), the MoE auxiliary loss or sequence parallelism. A model whose
forward takes no KV cache is logged once (``shared_prefix_unsupported``) and trained with TRL's pass.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from agentforge.trainers.prefix import common_head_len, prompt_groups, shared_prefix_forward
from agentforge.trainers.trl_private import check_trl_version

logger = logging.getLogger("agentforge.replay")

__all__ = ["PromptCompletionBatch", "SharedPrefixSFTTrainer", "split_prompt_completion"]

#: The keyword arguments of TRL's fused-head call in ``SFTTrainer.compute_loss`` that the shared pass answers.
_SHAREABLE_CALL = frozenset({"input_ids", "attention_mask", "labels", "use_cache", "fused_lm_head"})


class PromptCompletionBatch:
    """An SFT batch laid out for :func:`~agentforge.trainers.prefix.shared_prefix_forward`.

    Attributes:
        input_ids: ``(B, P + C)``: each row's prompt left-padded to ``P``, then its completion right-padded
            to ``C``.
        attention_mask: ``(B, P + C)``, 0 on padding.
        labels: ``(B, C)``: the completion's labels (``-100`` on tokens without loss and on padding).
        completion_len: ``C``.
    """

    __slots__ = ("attention_mask", "completion_len", "input_ids", "labels")

    def __init__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, completion_len: int
    ) -> None:
        self.input_ids, self.attention_mask = input_ids, attention_mask
        self.labels, self.completion_len = labels, completion_len


def split_prompt_completion(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, pad_token_id: int = 0
) -> PromptCompletionBatch | None:
    """Split TRL's right-padded SFT rows into prompts (left-padded) and completions (right-padded).

    A row's prompt is every token before its first loss token (the first label other than ``-100`` at a
    position >= 1: TRL's loss shifts the labels, so position 0 is never scored); its completion is the rest
    of the row, loss tokens and masked tokens (tool results) alike.

    Args:
        input_ids: ``(B, T)`` token ids, right-padded (TRL's ``DataCollatorForLanguageModeling``).
        attention_mask: ``(B, T)``, 1 on each row's first ``n`` tokens, 0 after.
        labels: ``(B, T)``, ``-100`` where there is no loss (prompt, masked tokens, padding).
        pad_token_id: the id written into padded slots (attention-masked; any valid id works).

    Returns:
        The :class:`PromptCompletionBatch`, or ``None`` when a row has no loss token or the batch is not
        right-padded (padding-free or packed layouts): those batches keep TRL's per-row pass.
    """
    rows, width = input_ids.shape
    lengths = attention_mask.sum(dim=1)
    positions = torch.arange(width, device=input_ids.device)
    if not torch.equal(attention_mask.bool(), positions < lengths[:, None]):
        return None
    scored = (labels[:, 1:] != -100) & attention_mask[:, 1:].bool()
    if not bool(scored.any(dim=1).all()):
        return None
    starts = scored.int().argmax(dim=1) + 1  # first loss token: the prompt is everything before it
    prompt_len, completion_len = int(starts.max()), int((lengths - starts).max())
    ids = input_ids.new_full((rows, prompt_len + completion_len), pad_token_id)
    mask = attention_mask.new_zeros((rows, prompt_len + completion_len))
    out_labels = labels.new_full((rows, completion_len), -100)
    for row, (start, n) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
        ids[row, prompt_len - start : prompt_len] = input_ids[row, :start]
        ids[row, prompt_len : prompt_len + n - start] = input_ids[row, start:n]
        mask[row, prompt_len - start : prompt_len + n - start] = 1
        out_labels[row, : n - start] = labels[row, start:n]
    return PromptCompletionBatch(ids, mask, out_labels, completion_len)


def _sft_trainer_base() -> type:
    """``trl.SFTTrainer``, once the installed TRL is the one whose ``compute_loss`` this module relies on.

    Raises:
        UserError: another TRL release (:func:`agentforge.trainers.trl_private.check_trl_version`).
    """
    from trl.trainer.sft_trainer import SFTTrainer

    check_trl_version("SFTTrainer.compute_loss's fused-head call (answered by SharedPrefixSFTTrainer)")
    return SFTTrainer


class _SharedPrefixModel:
    """Stands in for the model during one ``SFTTrainer.compute_loss``: answers its fused-head call with the
    shared-prefix pass when the batch allows it, and passes every other call and attribute to the model."""

    def __init__(self, trainer: SharedPrefixSFTTrainer, model: Any) -> None:
        self._trainer, self._model = trainer, model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not args and kwargs.get("fused_lm_head") and set(kwargs) <= _SHAREABLE_CALL:
            out = self._trainer._shared_forward(
                self._model, kwargs["input_ids"], kwargs["attention_mask"], kwargs["labels"]
            )
            if out is not None:
                return out
        self._trainer.fallback_calls += 1
        return self._model(*args, **kwargs)


class SharedPrefixSFTTrainer(_sft_trainer_base()):
    """``trl.SFTTrainer`` whose loss pass runs each batch's shared prompt head once (module docstring).

    ``shared_prefix_calls`` / ``fallback_calls`` count which path each loss pass took.
    """

    shared_prefix_calls = 0
    fallback_calls = 0
    shared_prefix_unsupported: str | None = None  # why the model cannot share (set on the first failure)

    def compute_loss(  # noqa: D102 - TRL's signature and contract
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        if self._loss_from_fused_head(return_outputs):
            model = _SharedPrefixModel(self, model)
        else:
            self.fallback_calls += 1
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _loss_from_fused_head(self, return_outputs: bool) -> bool:
        """Whether TRL's loss comes from its one fused-head call (the branch the shared pass can answer)."""
        config = self.accelerator.parallelism_config
        return not (
            return_outputs
            or self.compute_loss_func is not None
            or self.label_smoother is not None
            or self.aux_loss_enabled
            or (config is not None and getattr(config, "sp_enabled", False))
        )

    def _shared_forward(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> Any:
        """The fused-head output of the batch through the shared-prefix pass, or ``None`` to use TRL's."""
        checkpointing = (
            bool(getattr(self.args, "gradient_checkpointing", False))
            and model.training
            and torch.is_grad_enabled()
        )
        if checkpointing or self.shared_prefix_unsupported:
            return None
        pad = self.processing_class.pad_token_id if self.processing_class is not None else None
        batch = split_prompt_completion(input_ids, attention_mask, labels, pad or 0)
        if batch is None:
            return None
        groups = prompt_groups(batch.input_ids, batch.attention_mask, batch.completion_len)
        if len(groups) == input_ids.size(0) and not common_head_len(groups):
            return None  # nothing shared: TRL's batched pass is as cheap
        try:
            out = shared_prefix_forward(
                model,
                batch.input_ids,
                batch.attention_mask,
                batch.completion_len,
                labels=batch.labels,
                groups=groups,
            )
        except (TypeError, AttributeError, NotImplementedError) as exc:
            self.shared_prefix_unsupported = f"{type(exc).__name__}: {exc}"
            logger.warning(
                "shared-prefix SFT is not supported by this model (%s); using TRL's per-row pass",
                self.shared_prefix_unsupported,
            )
            return None
        self.shared_prefix_calls += 1
        return out
