"""Shared-prefix log-probabilities (``trainers/prefix.py``) against TRL's own per-row pass.

A tiny random Llama with TRL's fused LM head and a randomly initialised LoRA: the same left-padded batch
(prompts of different lengths, each repeated with right-padded completions, rows shuffled) goes through
``GRPOTrainer._get_per_token_logps_and_entropies`` and through :func:`shared_prefix_logps`; log-probs,
entropies and LoRA gradients must agree to float32 rounding.
"""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from tiny_policy import VOCAB, assert_same_as_per_row, lora_grads, tiny_policy, trl_logps

from agentforge.trainers.prefix import SharedPrefixGRPOTrainer, prompt_groups, shared_prefix_logps


def grpo_batch(prompt_lens=(3, 9, 17), group=4, completion_len=5, seed=1):
    """Left-padded prompts, each repeated ``group`` times with right-padded completions; rows shuffled."""
    gen = torch.Generator().manual_seed(seed)
    width = max(prompt_lens)
    ids, masks = [], []
    for plen in prompt_lens:
        prompt = torch.randint(3, VOCAB, (plen,), generator=gen)
        for _ in range(group):
            used = int(torch.randint(1, completion_len + 1, (), generator=gen))
            completion = torch.randint(3, VOCAB, (completion_len,), generator=gen)
            ids.append(torch.cat([torch.zeros(width - plen, dtype=torch.long), prompt, completion]))
            masks.append(
                torch.cat([torch.zeros(width - plen), torch.ones(plen), torch.arange(completion_len) < used])
            )
    order = torch.randperm(len(ids), generator=gen)
    return torch.stack(ids)[order], torch.stack(masks).long()[order], completion_len


def test_groups_follow_exact_prompt_ids_not_padding() -> None:
    ids, mask, c = grpo_batch(prompt_lens=(4, 4, 6), group=3)
    groups = prompt_groups(ids, mask, c)
    assert sorted(len(g.rows) for g in groups) == [3, 3, 3]
    assert sorted(r for g in groups for r in g.rows) == list(range(9))
    assert sorted(g.prompt.numel() for g in groups) == [4, 4, 6]


def test_values_and_gradients_equal_trl_per_row_pass() -> None:
    model = tiny_policy()
    model.train()
    ids, mask, c = grpo_batch()
    weight = torch.randn(ids.size(0), c)  # an arbitrary loss, so every position's gradient counts
    ref, ref_entropy = trl_logps(model, ids, mask, c)
    (ref * weight * mask[:, -c:]).sum().backward()
    ref_grads = lora_grads(model)
    got, entropy = shared_prefix_logps(model, ids, mask, c, compute_entropy=True)
    (got * weight * mask[:, -c:]).sum().backward()
    got_grads = lora_grads(model)

    real = mask[:, -c:].bool()
    assert got.shape == ref.shape == (ids.size(0), c)
    assert torch.all(ref[~real] == 0)
    assert_same_as_per_row(got, ref, entropy, ref_entropy, got_grads, ref_grads, real)


def test_one_token_prompt_and_no_entropy() -> None:
    model = tiny_policy(temperature=1.0)
    ids, mask, c = grpo_batch(prompt_lens=(1, 5), group=2, completion_len=3)
    ref, _ = trl_logps(model, ids, mask, c)
    got, entropy = shared_prefix_logps(model, ids, mask, c)
    assert entropy is None
    real = mask[:, -c:].bool()
    torch.testing.assert_close(got[real], ref[real], atol=2e-6, rtol=1e-5)


def test_bad_arguments_are_clear_errors() -> None:
    model = tiny_policy()
    ids, mask, c = grpo_batch(prompt_lens=(2,), group=2)
    with pytest.raises(ValueError, match="logits_to_keep"):
        shared_prefix_logps(model, ids, mask, 0)
    mask[:, : ids.size(1) - c] = 0  # every prompt token is padding
    with pytest.raises(ValueError, match="empty prompt"):
        shared_prefix_logps(model, ids, mask, c)


def test_trainer_falls_back_when_nothing_is_shared_or_checkpointing() -> None:
    """The override picks the path itself: TRL's pass for unique prompts or gradient checkpointing."""
    model = tiny_policy()
    trainer = object.__new__(SharedPrefixGRPOTrainer)  # only the attributes the method reads
    trainer.accelerator = SimpleNamespace(
        autocast=nullcontext, is_main_process=True, device=torch.device("cpu")
    )
    trainer.args = SimpleNamespace(gradient_checkpointing=False)
    shared_ids, shared_mask, c = grpo_batch(prompt_lens=(3, 6), group=3)
    unique_ids, unique_mask, _ = grpo_batch(prompt_lens=(3, 6, 8), group=1)
    method = SharedPrefixGRPOTrainer._get_per_token_logps_and_entropies
    method(trainer, model, shared_ids, shared_mask, c)
    assert (trainer.shared_prefix_calls, trainer.fallback_calls) == (1, 0)
    method(trainer, model, unique_ids, unique_mask, c)
    assert (trainer.shared_prefix_calls, trainer.fallback_calls) == (1, 1)
    trainer.args.gradient_checkpointing = True
    model.train()
    method(trainer, model, shared_ids, shared_mask, c)
    assert (trainer.shared_prefix_calls, trainer.fallback_calls) == (1, 2)
    with torch.no_grad():  # checkpointing only replays layers with gradients: no-grad passes still share
        method(trainer, model, shared_ids, shared_mask, c)
    assert (trainer.shared_prefix_calls, trainer.fallback_calls) == (2, 2)


class NoCacheModel(torch.nn.Module):
    """A policy whose forward takes only what TRL's per-row pass passes (no KV cache arguments)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask, labels=None, fused_lm_head=False):
        return self.inner(
            input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=fused_lm_head
        )


def test_model_without_kv_cache_support_falls_back_once_with_a_warning(caplog) -> None:
    model = NoCacheModel(tiny_policy())
    trainer = object.__new__(SharedPrefixGRPOTrainer)
    trainer.accelerator = SimpleNamespace(
        autocast=nullcontext, is_main_process=True, device=torch.device("cpu")
    )
    trainer.args = SimpleNamespace(gradient_checkpointing=False)
    ids, mask, c = grpo_batch(prompt_lens=(3, 6), group=3)
    method = SharedPrefixGRPOTrainer._get_per_token_logps_and_entropies
    with caplog.at_level("WARNING", logger="agentforge.trainer"):
        logps, _, _ = method(trainer, model, ids, mask, c)
        method(trainer, model, ids, mask, c)
    assert "not supported by this model" in caplog.text and caplog.text.count("not supported") == 1
    assert trainer.shared_prefix_unsupported.startswith("TypeError")
    assert (trainer.shared_prefix_calls, trainer.fallback_calls) == (0, 2)
    ref, _ = trl_logps(model, ids, mask, c)
    torch.testing.assert_close(logps, ref)
