"""vLLM general plugin: grouped LoRA matmuls for vLLM's CPU backend (installed into ``.venv-vllm`` only).

vLLM's CPU LoRA path (``vllm.lora.ops.torch_ops``, used by ``PunicaWrapperCPU``) computes every
``bgmv`` op as ``einsum("bi,boi->bo", x, W[indices])``: it gathers a full ``(out, in)`` adapter matrix
**per token** before multiplying. For a 2,500-token prefill through SmolLM2-135M's MLP that is hundreds of
MB copied per projection, so a request with an adapter runs 3-7x slower than the base model, and
batching more requests makes it worse. Here each op groups the tokens by adapter slot and does one
matmul per slot present in the batch, ``x[rows] @ W[slot].T`` — the same arithmetic (the same slot
indexing, negative indices included, the same dtype casts and output slicing), without the gather.

vLLM loads ``vllm.general_plugins`` entry points in every process it starts (API server, engine core,
workers); :func:`register` patches the ops there, only on the CPU platform. Set
``AGENTFORGE_VLLM_CPU_LORA=0`` to keep vLLM's own ops. Tested against vLLM's originals in
``tests/test_vllm_cpu_lora.py``.
"""

from __future__ import annotations

import os

import torch

__all__ = ["bgmv_expand", "bgmv_expand_slice", "bgmv_shrink", "register"]

PATCHED_MODULES = (
    "vllm.lora.ops.torch_ops.lora_ops",
    "vllm.lora.ops.torch_ops",
    "vllm.lora.punica_wrapper.punica_cpu",
)


def _grouped(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``out[t] = inputs[t] @ weights[indices[t]].T`` with one matmul per distinct slot.

    Args:
        inputs: ``(T, in)``.
        weights: stacked adapters ``(L, out, in)`` or ``(L, 1, out, in)``.
        indices: ``(T,)`` slot per token (Python indexing: ``-1`` is the last slot, as in vLLM's op).
        dtype: compute and output dtype (vLLM casts both operands to the output tensor's dtype).

    Returns:
        ``(T, out)`` in ``dtype``.
    """
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    x = inputs.to(dtype)
    slots = torch.unique(indices)
    if slots.numel() == 1:
        return x @ weights[int(slots)].to(dtype).T
    out = x.new_empty((x.shape[0], weights.shape[1]))
    for slot in slots.tolist():
        rows = (indices == slot).nonzero().squeeze(1)
        out[rows] = x[rows] @ weights[slot].to(dtype).T
    return out


def bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0) -> None:
    """vLLM's ``bgmv_shrink`` (same signature and effect), grouped by adapter slot."""
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True) -> None:
    """vLLM's ``bgmv_expand`` (same signature and effect), grouped by adapter slot."""
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common_len = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_expand_slice(
    inputs,
    lora_b_weights,
    output_tensor,
    lora_indices_tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand_slice`` (same signature and effect), grouped by adapter slot."""
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs[:]


def register() -> None:
    """vLLM plugin entry point: patch the CPU LoRA ops in this process (idempotent; CPU platform only)."""
    if os.environ.get("AGENTFORGE_VLLM_CPU_LORA", "1") == "0":
        return
    import importlib

    from vllm.logger import init_logger
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    ours = {"bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand, "bgmv_expand_slice": bgmv_expand_slice}
    for name in PATCHED_MODULES:
        module = importlib.import_module(name)
        for attr, func in ours.items():
            if hasattr(module, attr):
                setattr(module, attr, func)
    init_logger("vllm.agentforge_cpu_lora").info(
        "agentforge: grouped CPU LoRA ops active (pid %d)", os.getpid()
    )
