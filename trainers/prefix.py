"""Shared-prefix log-probabilities for GRPO: each prompt goes through the model once, not G times.

A GRPO batch holds ``G`` completions of every prompt. TRL's ``GRPOTrainer`` scores each row separately
(``prompt + completion`` per row), so a 200-token prompt with 4-token completions costs ``G × 204`` token
positions of forward *and* backward. Here the rows are grouped by their exact prompt ids; the prompt
(all but its last token) runs once and fills a KV cache, the cache is repeated ``G`` times in the batch
dimension, and only ``[last prompt token] + completion[:-1]`` runs per row against it. Gradients flow
through the cache into the prompt passes, so the result (values and gradients) equals the per-row
computation up to floating-point rounding.

**Passes.** Agents' prompts usually also share a long head across groups (system prompt, tool schemas,
examples) and differ only in a short tail (the task). The longest common prefix of all distinct prompts
(:func:`common_head_len`) runs once, batch 1; its cache is repeated per group and each group's tail runs
against it (one batch, tails left-padded); the cache is then repeated per row for the completions. So
three model calls per pass, whatever the number of groups: head, tails, completions. With no common head
of :data:`MIN_HEAD_TOKENS` or more (or a single group) the head pass is skipped and the distinct prompts
run left-padded as one batch (two calls). Without a head, the left padding only shifts every position of
a row by a constant, which relative RoPE ignores. With one, the padding sits *between* the head and a
tail, so the tail and completion passes get explicit ``position_ids`` (head ``0..H-1``, tail
``H..H+t-1``, completion after), while the 2D attention mask zeroes the padded slots: in ``transformers``
5.x, ``create_causal_mask`` with a ``DynamicCache`` orders by cache slot (causal) and masks by the 2D
mask, and ``position_ids`` reach only the rotary embedding. (Models whose sliding window is shorter than
the sequence would see the padding counted in the window; such long sequences are not what this is for.)

This is the "shared-prefix forward" of Prefix Grouper (Liu et al. 2025, arXiv:2506.05433), done with
the model's own KV cache instead of a custom attention kernel, so any decoder-only ``transformers`` model
with a ``DynamicCache`` works. Batches it cannot help (no repeated prompt, multimodal inputs, MoE
auxiliary loss, the gradient pass under gradient checkpointing) fall back to TRL's own computation unchanged.

The completion part is projected through TRL's fused LM head (``add_fused_lm_head``), the same kernel and
temperature TRL uses, so log-probabilities and entropies match TRL's definitions exactly.

Replay SFT uses the same pass (:func:`shared_prefix_forward`, with its own labels: tool results inside a
completion are attended but not scored) through :mod:`agentforge.trainers.replay.prefix_sft`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from agentforge.trainers.logp_memory import token_chunked_head, unrepeated_kv_heads
from agentforge.trainers.micro_batches import grouped_split

logger = logging.getLogger("agentforge.trainer")

__all__ = [
    "MIN_HEAD_TOKENS",
    "PromptGroup",
    "SharedPrefixGRPOTrainer",
    "common_head_len",
    "prompt_groups",
    "shared_prefix_forward",
    "shared_prefix_logps",
]


class PromptGroup:
    """Rows of a batch whose prompts are identical token for token.

    Attributes:
        prompt: the unpadded prompt ids, shape ``(L,)``, ``L >= 1``.
        rows: indices of the rows (in the batch) that share it.
    """

    __slots__ = ("prompt", "rows")

    def __init__(self, prompt: torch.Tensor, rows: list[int]) -> None:
        self.prompt, self.rows = prompt, rows


def prompt_groups(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int
) -> list[PromptGroup]:
    """Group the rows of a ``prompt + completion`` batch by their exact (unpadded) prompt ids.

    Args:
        input_ids: ``(B, P + C)`` token ids, prompts left-padded (TRL's layout).
        attention_mask: ``(B, P + C)``, 0 on padding.
        completion_len: ``C``, the number of trailing completion positions.

    Returns:
        Groups in order of first appearance; every row is in exactly one group. Rows whose prompt is
        empty (all padding) share one group with an empty ``prompt``.
    """
    prompt_ids = input_ids[:, : input_ids.size(1) - completion_len]
    prompt_mask = attention_mask[:, : input_ids.size(1) - completion_len].bool()
    groups: dict[bytes, PromptGroup] = {}
    out: list[PromptGroup] = []
    for row in range(input_ids.size(0)):
        prompt = prompt_ids[row][prompt_mask[row]]
        key = prompt.cpu().numpy().tobytes()
        if key in groups:
            groups[key].rows.append(row)
        else:
            groups[key] = PromptGroup(prompt, [row])
            out.append(groups[key])
    return out


def _cache_kwarg(model: torch.nn.Module) -> str:
    """The forward argument that takes a KV cache: ``cache`` (transformers >= 5.x) or ``past_key_values``."""
    get_base_model = getattr(model, "get_base_model", None)
    base = get_base_model() if get_base_model is not None else model
    inner = getattr(base, "model", base)
    params = inspect.signature(type(inner).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _output_cache(outputs: Any) -> Any:
    cache = getattr(outputs, "cache", None)
    return cache if cache is not None else outputs.past_key_values


#: The shortest common head (tokens) worth a pass of its own; a shorter one stays in each prompt's pass.
MIN_HEAD_TOKENS = 2


def common_head_len(groups: list[PromptGroup]) -> int:
    """How many leading tokens every group's prompt shares, each prompt keeping at least its last token.

    Args:
        groups: :func:`prompt_groups` of one batch.

    Returns:
        The head length ``H``, or 0 when a head pass would save nothing: fewer than 2 groups (the head would
        be the whole prompt pass) or ``H < MIN_HEAD_TOKENS``.
    """
    if len(groups) < 2:
        return 0
    limit = min(g.prompt.numel() for g in groups) - 1
    if limit < MIN_HEAD_TOKENS:
        return 0
    first = groups[0].prompt[:limit]
    same = torch.stack([g.prompt[:limit] == first for g in groups[1:]]).all(dim=0)
    head = int(same.long().cumprod(0).sum())
    return head if head >= MIN_HEAD_TOKENS else 0


def shared_prefix_logps(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    *,
    compute_entropy: bool = False,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    groups: list[PromptGroup] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities (and entropies) of the completions, each distinct prompt run once.

    The common head of all prompts runs once, then each group's tail, then every row's completion
    (module docstring).

    The model must carry TRL's fused LM head (``trl.trainer.utils.add_fused_lm_head``, added by
    ``GRPOTrainer``), which applies the sampling temperature.

    Args:
        model: causal LM (optionally PEFT-wrapped) with the fused LM head.
        input_ids: ``(B, P + C)`` prompt + completion ids, prompts left-padded.
        attention_mask: ``(B, P + C)``.
        logits_to_keep: ``C``.
        compute_entropy: also return per-token entropies.
        autocast: context manager factory for mixed precision (TRL uses ``accelerator.autocast``).
        groups: precomputed :func:`prompt_groups` (computed when ``None``).

    Returns:
        ``(logps, entropies)``, each ``(B, C)`` float tensors in row order (``entropies`` is ``None``
        unless requested). Positions whose label is padding hold 0, as in TRL.

    Raises:
        ValueError: ``logits_to_keep`` is not in ``1..P+C``, or a row's prompt is empty.
    """
    out = shared_prefix_forward(
        model, input_ids, attention_mask, logits_to_keep, autocast=autocast, groups=groups
    )
    return out.log_probs, (out.entropy if compute_entropy else None)


def shared_prefix_forward(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    *,
    labels: torch.Tensor | None = None,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    groups: list[PromptGroup] | None = None,
) -> Any:
    """The fused-head output of the completions, each distinct prompt run once (:func:`shared_prefix_logps`).

    Args:
        model: causal LM (optionally PEFT-wrapped) with TRL's fused LM head.
        input_ids: ``(B, P + C)`` prompt + completion ids, prompts left-padded.
        attention_mask: ``(B, P + C)``.
        logits_to_keep: ``C``.
        labels: ``(B, C)`` the completion tokens to score, ``-100`` where none is wanted (SFT: tool
            results the model attends to but did not sample). Default: the completion ids wherever the
            attention mask is 1.
        autocast: as in :func:`shared_prefix_logps`.
        groups: precomputed :func:`prompt_groups` (computed when ``None``).

    Returns:
        TRL's ``FusedCausalLMOutput`` of the completion pass: its per-token fields (``log_probs``,
        ``label_mask`` and whichever of ``entropy``/``is_top1``/... the head computes) are ``(B, C)`` in row
        order, 0 where the label is ``-100``.

    Raises:
        ValueError: ``logits_to_keep`` is not in ``1..P+C``, ``labels`` is not ``(B, C)``, or a row's
            prompt is empty.
    """
    total = input_ids.size(1)
    if not 1 <= logits_to_keep <= total:
        raise ValueError(f"logits_to_keep={logits_to_keep} must be in 1..{total}")
    groups = groups if groups is not None else prompt_groups(input_ids, attention_mask, logits_to_keep)
    if any(g.prompt.numel() == 0 for g in groups):
        raise ValueError(
            "a row has an empty prompt: there is no prefix to share (use the per-row computation)"
        )
    device, rows = input_ids.device, input_ids.size(0)
    group_of_row = torch.empty(rows, dtype=torch.long, device=device)
    for index, group in enumerate(groups):
        group_of_row[torch.tensor(group.rows, device=device)] = index
    completions = input_ids[:, -logits_to_keep:]
    completion_mask = attention_mask[:, -logits_to_keep:]
    if labels is None:
        labels = completions.masked_fill(completion_mask == 0, -100)
    elif labels.shape != completions.shape:
        raise ValueError(f"labels {tuple(labels.shape)} must be (B, C) = {tuple(completions.shape)}")
    last_prompt_token = torch.stack([g.prompt[-1] for g in groups])[group_of_row]
    step_in = torch.cat([last_prompt_token[:, None], completions[:, :-1]], dim=1)
    head = common_head_len(groups)
    kwargs, prefix_mask, prefix_len = _prompt_cache(model, groups, head, attention_mask, autocast)
    if cache_kw := next(iter(kwargs), None):
        kwargs[cache_kw].batch_select_indices(group_of_row)
    if head:  # padding sits between each prompt's tail and its completion: RoPE needs the true positions
        steps = torch.arange(logits_to_keep, device=device)
        kwargs["position_ids"] = prefix_len[group_of_row, None] + steps
    mask = torch.cat(
        [prefix_mask[group_of_row], completion_mask.new_ones((rows, 1)), completion_mask[:, :-1]], dim=1
    )
    with autocast():
        return model(
            input_ids=step_in, attention_mask=mask, shift_labels=labels, fused_lm_head=True, **kwargs
        )


def _prompt_cache(
    model: torch.nn.Module,
    groups: list[PromptGroup],
    head: int,
    like: torch.Tensor,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """Run every group's prompt but its last token: the ``head`` once (batch 1), then each group's tail.

    Args:
        model: as in :func:`shared_prefix_logps`.
        groups: the batch's groups (``n`` of them).
        head: :func:`common_head_len` (0: no head pass, the prompts run left-padded as one batch).
        like: a tensor with the attention mask's dtype and device.
        autocast: as in :func:`shared_prefix_logps`.

    Returns:
        ``(kwargs, mask, lengths)``: ``{cache argument: cache with n rows}`` (empty when every prompt is one
        token), the cache's attention mask ``(n, head + W)`` (tails left-padded to ``W``; padding is 0) and
        each group's count of cached tokens ``(n,)``, i.e. the position of its last prompt token.
    """
    n, device = len(groups), like.device
    tails = [g.prompt[head:-1] for g in groups]
    width = max(t.numel() for t in tails)
    tail_ids = torch.zeros((n, width), dtype=groups[0].prompt.dtype, device=device)
    tail_mask = like.new_zeros((n, width))
    for index, tail in enumerate(tails):
        if tail.numel():
            tail_ids[index, width - tail.numel() :] = tail
            tail_mask[index, width - tail.numel() :] = 1
    lengths = torch.tensor([head + t.numel() for t in tails], device=device)
    mask = torch.cat([like.new_ones((n, head)), tail_mask], dim=1)
    if not head + width:
        return {}, mask, lengths
    cache_kw, cache = _cache_kwarg(model), None
    if head:
        with autocast():
            out = model(
                input_ids=groups[0].prompt[None, :head],
                attention_mask=mask[:1, :head],
                use_cache=True,
                logits_to_keep=1,
                **{cache_kw: None},
            )
        cache = _output_cache(out)
        cache.batch_repeat_interleave(n)
    if width:
        extra: dict[str, Any] = {}
        if head:  # left padding between head and tail: each tail token at its true position
            pad = (width - (lengths - head))[:, None]
            extra["position_ids"] = head + (torch.arange(width, device=device) - pad).clamp(min=0)
        with autocast():
            out = model(
                input_ids=tail_ids,
                attention_mask=mask,
                use_cache=True,
                logits_to_keep=1,
                **extra,
                **{cache_kw: cache},
            )
        cache = _output_cache(out)
    return {cache_kw: cache}, mask, lengths


def _grpo_trainer_base() -> type:
    """``trl.GRPOTrainer``, once the installed TRL is the one whose private method is overridden below.

    Raises:
        UserError: another TRL release (:func:`agentforge.trainers.trl_private.check_trl_version`).
    """
    from trl.trainer.grpo_trainer import GRPOTrainer

    from agentforge.trainers.trl_private import check_trl_version

    check_trl_version(
        "GRPOTrainer._get_per_token_logps_and_entropies (overridden by SharedPrefixGRPOTrainer)"
    )
    return GRPOTrainer


class SharedPrefixGRPOTrainer(_grpo_trainer_base()):
    """``trl.GRPOTrainer`` whose log-probability passes share each group's prompt (:func:`shared_prefix_logps`).

    Used for the policy forward (with gradients) and TRL's old-logprob pass (importance sampling). Falls
    back to TRL's per-row computation when the batch has no repeated prompt, carries multimodal inputs,
    needs the MoE auxiliary loss, or for the gradient pass under gradient checkpointing (transformers drops
    KV caches in checkpointed layers; the no-grad old-policy and reference passes still share).
    ``shared_prefix_calls`` / ``fallback_calls`` count which path ran. A model whose forward does not take a
    KV cache (``TypeError``/``AttributeError``/``NotImplementedError`` from the shared pass) is logged once
    in ``shared_prefix_unsupported`` and trained with TRL's pass from then on. Memory: the LM head runs in calls of
    ``args.logprob_chunk_tokens`` tokens, CPU attention keeps its KV heads (:mod:`~agentforge.trainers.logp_memory`),
    micro-batches hold whole groups (:func:`~agentforge.trainers.micro_batches.grouped_split`).
    """

    shared_prefix_calls = 0
    fallback_calls = 0
    shared_prefix_unsupported: str | None = None  # why the model cannot share (set on the first failure)

    def _prepare_inputs(self, generation_batch: Any) -> Any:
        with grouped_split():  # micro-batches of whole groups: each prompt runs once per step (micro_batches)
            return super()._prepare_inputs(generation_batch)

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D401 - TRL's
        # The LM head in calls of at most logprob_chunk_tokens tokens, KV heads not repeated (logp_memory)
        chunks = int(getattr(self.args, "logprob_chunk_tokens", 0))
        # Not under gradient checkpointing: its backward replays the layers outside this block, with repeated
        # heads, and torch refuses a replay whose saved tensors differ in shape (CheckpointError)
        replayed = getattr(self.args, "gradient_checkpointing", False) and torch.is_grad_enabled()
        kv = nullcontext() if replayed else unrepeated_kv_heads(self.accelerator.device)
        with token_chunked_head(chunks), kv:
            return self._shared_or_trl_logps(*args, **kwargs)

    def _shared_or_trl_logps(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **extra: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        groups = None
        # Gradient checkpointing drops KV caches in layers that replay their forward (with gradients only).
        checkpointing = (
            getattr(self.args, "gradient_checkpointing", False) and model.training and torch.is_grad_enabled()
        )
        if not compute_aux_loss and not checkpointing and all(v is None for v in extra.values()):
            groups = prompt_groups(input_ids, attention_mask, logits_to_keep)
            if len(groups) == input_ids.size(0) or any(g.prompt.numel() == 0 for g in groups):
                groups = None  # nothing shared: TRL's batched pass is as cheap
        if groups is not None and not self.shared_prefix_unsupported:
            try:
                logps, entropies = shared_prefix_logps(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    compute_entropy=compute_entropy,
                    autocast=self.accelerator.autocast,
                    groups=groups,
                )
            except (TypeError, AttributeError, NotImplementedError) as exc:
                # A model whose forward takes no KV cache / fused head arguments: say so once, then use TRL's.
                self.shared_prefix_unsupported = f"{type(exc).__name__}: {exc}"
                logger.warning(
                    "shared-prefix log-probs are not supported by this model (%s); using TRL's per-row pass",
                    self.shared_prefix_unsupported,
                )
            else:
                self.shared_prefix_calls += 1
                return logps, entropies, None
        self.fallback_calls += 1
        return super()._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size,
            compute_entropy,
            compute_aux_loss,
            **extra,
        )
