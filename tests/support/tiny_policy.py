"""A tiny random Llama policy with TRL's fused LM head and a LoRA, and TRL's own per-row log-prob pass to compare
against (the shared-prefix tests: ``tests/unit/core/test_prefix.py``, ``tests/unit/trainers/test_prefix_head.py``)."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

#: The tiny model's vocabulary size.
VOCAB = 96


def tiny_policy(temperature: float = 0.7):  # type: ignore[no-untyped-def]
    """A 2-layer random Llama (seed 0) with TRL's fused head (log-probs and entropy) and a random rank-4 LoRA."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config)
    add_fused_lm_head(model, temperature=temperature, outputs=("log_probs", "entropy"))
    return get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))


def trl_logps(model, ids, mask, c):  # type: ignore[no-untyped-def]
    """TRL's per-row ``(logps, entropies)`` of the last ``c`` positions (its profiling wrapper skipped)."""
    fake_trainer = SimpleNamespace(accelerator=SimpleNamespace(autocast=nullcontext))
    per_row = GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__
    logps, entropies, _ = per_row(fake_trainer, model, ids, mask, c, compute_entropy=True)
    return logps, entropies


def lora_grads(model):  # type: ignore[no-untyped-def]
    """The trainable parameters' gradients (cloned), then zeroed."""
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    return grads


def assert_same_as_per_row(got, ref, entropy, ref_entropy, got_grads, ref_grads, real) -> None:  # type: ignore[no-untyped-def]
    """Log-probs and entropies equal on the ``real`` positions (float32 rounding: TRL's fused head computes in
    float32), 0 elsewhere, and the same LoRA gradients up to rounding."""
    torch.testing.assert_close(got[real], ref[real], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(entropy[real], ref_entropy[real], atol=2e-6, rtol=1e-5)
    assert torch.all(got[~real] == 0)
    assert ref_grads.keys() == got_grads.keys() and ref_grads
    for name, grad in ref_grads.items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(
            got_grads[name], grad, atol=1e-5 * scale, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}"
        )
