"""What bounds a log-probability pass's memory: the LM head in token chunks, attention without repeated KV heads.

**The LM head.** TRL 1.16's fused LM head (``trl.trainer.utils.add_fused_lm_head``, which every GRPO log-probability pass uses)
never materialises the ``(B, T, V)`` logits: ``trl.kernels.ChunkedLogProbFunction`` projects the hidden states
in tiles of up to 4,096 tokens × 32,768 vocabulary entries, folds each tile into running log-sum-exp
statistics, keeps only the hidden states for the backward and recomputes each tile there. On devices without
Triton (CPU) the tile is folded by plain torch ops, each a float32 copy of the tile (0.5 GB at full size), so
one call's transient grows with its token count up to 4,096 tokens. Measured on SmolLM2-135M's head
(V = 49,152, bf16 autocast, 2 CPU cores): forward + backward of 800 tokens peaks 1.2 GB above its inputs,
3,200 tokens 4.0 GB, 8,000 tokens 5.0 GB; cut into calls of 512 tokens, 0.95 GB at 3,200 tokens.

:func:`token_chunked_head` makes every fused-head call inside it go through TRL's kernel in calls of at most
``tokens`` tokens: each call is its own autograd node that saves a view of its hidden states and recomputes
its tiles in the backward (which is what checkpointing each chunk's projection would do), so the transient is
bounded by the chunk while the values are the same (each token's log-sum-exp never spans tokens) and the
gradients the same up to float rounding (a weight gradient is summed over chunks instead of inside one call;
LoRA does not train the head). Outside the context, or with ``tokens`` 0, the kernel runs as TRL calls it.

It replaces ``trl.trainer.utils._ChunkedLogProbFunction``, the private name the fused forward looks the kernel
up by at every call, with a class that delegates to it; so it checks the tested TRL release first
(:func:`~agentforge.trainers.trl_private.check_trl_version`).

**Attention.** SmolLM2 has 9 query heads and 3 key/value heads. ``transformers`` repeats the key/value heads to 9
before ``torch``'s scaled-dot-product attention whenever there is an attention mask (its ``repeat_kv``), and that
3× copy is what the attention saves for the backward: in the shared-prefix completion pass, every row's
repeated prompt cache (rows × 30 layers × 2 × 9 heads × ~1,400 positions × 64, 0.77 GB at 8 rows in bf16).
On CPU, torch's flash kernel takes the 3 heads with a mask (``enable_gqa=True``), same values and gradients up
to bf16 rounding, and faster; :func:`unrepeated_kv_heads` asks ``transformers`` for that (its
``TRANSFORMERS_SDPA_FORCE_GQA`` switch, read at every attention call) for the passes inside it, on CPU only
(CUDA's kernels fall back to the math kernel with a mask and grouped heads).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch

from agentforge.trainers.trl_private import check_trl_version

__all__ = ["chunked_logprobs", "token_chunked_head", "unrepeated_kv_heads"]

#: Tokens per fused-head call inside :func:`token_chunked_head` (0: TRL's own call).
_CHUNK_TOKENS: ContextVar[int] = ContextVar("agentforge_head_chunk_tokens", default=0)


def chunked_logprobs(
    kernel: Any, tokens: int, hidden: torch.Tensor, weight: torch.Tensor, *args: Any
) -> tuple:
    """``kernel.apply(hidden, weight, *args)`` (TRL's ``ChunkedLogProbFunction``) in calls of ``tokens`` tokens.

    Args:
        kernel: ``trl.kernels.ChunkedLogProbFunction`` (or anything with its ``apply`` signature).
        tokens: the most tokens (rows of ``hidden``) one call projects; 0 or ≥ ``N``: one call.
        hidden: ``(N, H)`` hidden states, one row per scored position.
        weight: ``(V, H)`` LM head weight.
        *args: the kernel's other arguments, ``bias, targets (N,), temperature, ...``; ``targets`` is split
            with ``hidden``.

    Returns:
        The kernel's tuple of per-token outputs, each ``(N,)`` (``None`` where the kernel returns ``None``),
        the chunks' outputs concatenated in order.

    Raises:
        ValueError: ``tokens`` is negative.
    """
    if tokens < 0:
        raise ValueError(f"tokens={tokens} must be >= 0")
    n = hidden.size(0)
    if not tokens or n <= tokens:
        return tuple(kernel.apply(hidden, weight, *args))
    bias, targets, *rest = args
    parts = [
        kernel.apply(hidden[start : start + tokens], weight, bias, targets[start : start + tokens], *rest)
        for start in range(0, n, tokens)
    ]
    return tuple(None if outs[0] is None else torch.cat(outs) for outs in zip(*parts, strict=True))


class _TokenChunkedKernel:
    """Stands in for TRL's kernel name in ``trl.trainer.utils``: :func:`chunked_logprobs` at the context's size."""

    kernel: Any = None

    @classmethod
    def apply(cls, hidden: torch.Tensor, weight: torch.Tensor, *args: Any) -> tuple:
        return chunked_logprobs(cls.kernel, _CHUNK_TOKENS.get(), hidden, weight, *args)


def _install() -> None:
    """Route the fused head's kernel look-up through :class:`_TokenChunkedKernel` (once per process)."""
    from trl.trainer import utils

    # TRL's private module binding (an import it does not re-export), replaced on purpose
    kernel = utils._ChunkedLogProbFunction  # type: ignore[attr-defined]
    if kernel is not _TokenChunkedKernel:
        check_trl_version("trl.trainer.utils._ChunkedLogProbFunction (token-chunked by agentforge)")
        _TokenChunkedKernel.kernel = kernel
        utils._ChunkedLogProbFunction = _TokenChunkedKernel  # type: ignore[attr-defined]


@contextmanager
def token_chunked_head(tokens: int) -> Iterator[None]:
    """Inside: every fused LM head call projects at most ``tokens`` tokens per kernel call (module docstring).

    Args:
        tokens: tokens per call; 0 leaves TRL's call as it is.

    Raises:
        ValueError: ``tokens`` is negative.
        UserError: the installed TRL is not the tested release (only when ``tokens`` > 0).
    """
    if tokens < 0:
        raise ValueError(f"tokens={tokens} must be >= 0")
    if tokens:
        _install()
    reset = _CHUNK_TOKENS.set(tokens)
    try:
        yield
    finally:
        _CHUNK_TOKENS.reset(reset)


#: ``transformers``' switch for grouped key/value heads in its SDPA attention (``use_gqa_in_sdpa``).
_FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"


@contextmanager
def unrepeated_kv_heads(device: torch.device) -> Iterator[None]:
    """Inside, on CPU: SDPA attention gets the model's own key/value heads, not repeated ones (module docstring).

    Args:
        device: the model's device; anything but ``cpu`` leaves attention as it is.
    """
    if device.type != "cpu" or _FORCE_GQA in os.environ:  # elsewhere, or the user decided
        yield
        return
    os.environ[_FORCE_GQA] = "1"
    try:
        yield
    finally:
        os.environ.pop(_FORCE_GQA, None)
