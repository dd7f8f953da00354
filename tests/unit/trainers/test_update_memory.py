"""Issue 35, item 6: the update in bounded memory.

* ``max_rows_per_micro_batch`` derives the accumulation: the fewest equal micro-batches of at most that many
  rows (the given accumulation is a floor), so memory is flat in rollouts per step and the update unchanged;
* a step's micro-batches hold whole prompt groups (TRL's row shuffle → a group shuffle), so the shared-prefix pass
  runs each prompt once per step;
* ``logprob_chunk_tokens`` runs TRL's fused LM head in calls of at most that many tokens (``trainers/
  logp_memory.py``): values equal the one-call head's, LoRA gradients equal up to rounding, on both log-prob
  paths (the shared-prefix pass and TRL's per-row pass), and the calls really are that small.
"""

from __future__ import annotations

import re

import pytest
import torch
from test_prefix_head import head_batch
from tiny_policy import assert_same_as_per_row, lora_grads, tiny_policy, trl_logps

from agentforge.errors import ConfigError
from agentforge.trainers.grpo_config import TrainConfig
from agentforge.trainers.logp_memory import (
    _TokenChunkedKernel,
    chunked_logprobs,
    token_chunked_head,
    unrepeated_kv_heads,
)
from agentforge.trainers.micro_batches import group_shuffle, micro_batches
from agentforge.trainers.prefix import shared_prefix_logps


@pytest.mark.parametrize(
    ("rows", "given", "cap", "want"),
    [
        (32, 1, 8, 4),  # 4 micro-batches of 8
        (8, 1, 8, 1),  # fits: one micro-batch
        (12, 1, 8, 2),  # 12 = 2 x 6 (3 x 4 would be more passes than needed)
        (10, 1, 4, 5),  # divisors 1, 2, 5, 10: 5 rows do not fit, 2 do
        (7, 1, 2, 7),  # prime: one row each
        (32, 8, 8, 8),  # the given accumulation is a floor
        (32, 2, 0, 2),  # no cap
    ],
)
def test_micro_batches_is_the_smallest_divisor_within_the_budget(rows, given, cap, want) -> None:  # type: ignore[no-untyped-def]
    assert micro_batches(rows, given, cap) == want


def test_config_derives_the_accumulation_from_the_row_budget(tmp_path) -> None:  # type: ignore[no-untyped-def]
    common = dict(output_dir=str(tmp_path), num_generations=8, use_cpu=True)
    for tasks in (1, 4, 16):  # rows per micro-batch stay 8 whatever the rollouts per step
        config = TrainConfig(tasks_per_step=tasks, **common)
        assert config.per_device_train_batch_size == 8
        assert config.gradient_accumulation_steps == config.steps_per_generation == tasks
        assert config.generation_batch_size == 8 * tasks
    old = TrainConfig(tasks_per_step=4, max_rows_per_micro_batch=0, **common)
    assert (old.gradient_accumulation_steps, old.per_device_train_batch_size) == (1, 32)
    again = TrainConfig(tasks_per_step=4, gradient_accumulation_steps=4, steps_per_generation=4, **common)
    assert again.gradient_accumulation_steps == 4, "a derived config built again (resume) keeps its split"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"max_rows_per_micro_batch": -1},
            "max_rows_per_micro_batch=-1 / logprob_chunk_tokens=512 must be >= 0",
        ),
        ({"logprob_chunk_tokens": -8}, "logprob_chunk_tokens=-8 must be >= 0"),
        ({"steps_per_generation": 2}, "steps_per_generation = gradient_accumulation_steps = 4"),
    ],
)
def test_bad_memory_settings_are_refused_with_numbers(tmp_path, fields, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(output_dir=str(tmp_path), num_generations=8, tasks_per_step=4, use_cpu=True, **fields)
    with pytest.raises(ConfigError, match=re.escape("cannot split 8 rows into micro-batches")):
        micro_batches(8, 3, 4)


def test_group_shuffle_keeps_each_prompt_group_together() -> None:
    """Rows of one prompt (4 groups of 4, left-padded prompts) stay consecutive; every value moves in unison."""
    prompts = [[0, 0, 5, 6], [0, 7, 8, 9], [3, 4, 5, 6], [0, 0, 0, 9]]
    ids = torch.tensor([p for p in prompts for _ in range(4)])
    batch = {
        "prompt_ids": ids,
        "prompt_mask": (ids != 0).long(),
        "row": torch.arange(16),
        "names": list("abcdefghijklmnop"),
        "num_items_in_batch": torch.tensor(16),
        "old_per_token_logps": None,
    }
    orders = set()
    for seed in range(8):
        torch.manual_seed(seed)
        out = group_shuffle(batch)
        rows = out["row"].tolist()
        assert sorted(rows) == list(range(16)) and out["names"] == [batch["names"][r] for r in rows]
        assert torch.equal(out["prompt_ids"], ids[rows]) and out["old_per_token_logps"] is None
        assert int(out["num_items_in_batch"]) == 16
        groups = [r // 4 for r in rows]
        assert all(groups[i] == groups[i - i % 4] for i in range(16)), f"a group split up: {groups}"
        orders.add(tuple(groups[::4]))
    assert len(orders) > 1, "the groups' order is shuffled"


class _Spy:
    """Counts the tokens of every call to TRL's kernel (wraps it in :class:`_TokenChunkedKernel`)."""

    def __init__(self, kernel) -> None:  # type: ignore[no-untyped-def]
        self.kernel, self.tokens = kernel, []

    def apply(self, hidden, *args):  # type: ignore[no-untyped-def]
        self.tokens.append(hidden.size(0))
        return self.kernel.apply(hidden, *args)


@pytest.fixture
def kernel_calls(monkeypatch):  # type: ignore[no-untyped-def]
    with token_chunked_head(1):  # installs the stand-in, so the spy sits behind it
        pass
    spy = _Spy(_TokenChunkedKernel.kernel)
    monkeypatch.setattr(_TokenChunkedKernel, "kernel", spy)
    return spy.tokens


@pytest.mark.parametrize("path", ["shared_prefix", "trl_per_row"])
def test_token_chunked_head_equals_one_call(path, kernel_calls) -> None:  # type: ignore[no-untyped-def]
    """Log-probs, entropies and LoRA gradients in calls of 7 tokens equal those of one call per pass."""
    model = tiny_policy()
    model.train()
    ids, mask, c = head_batch(tail_lens=(0, 3, 8))
    weight = torch.randn(ids.size(0), c)  # an arbitrary loss, so every position's gradient counts

    def run(tokens: int):  # type: ignore[no-untyped-def]
        kernel_calls.clear()
        with token_chunked_head(tokens):
            if path == "shared_prefix":
                logps, entropy = shared_prefix_logps(model, ids, mask, c, compute_entropy=True)
            else:
                logps, entropy = trl_logps(model, ids, mask, c)
        ((logps * weight + entropy) * mask[:, -c:]).sum().backward()
        return logps.detach(), entropy.detach(), lora_grads(model), list(kernel_calls)

    ref, ref_entropy, ref_grads, ref_calls = run(0)
    got, entropy, grads, calls = run(7)
    assert len(ref_calls) == 1 and ref_calls[0] > 7, "unchunked: one kernel call over every scored position"
    assert max(calls) <= 7 and sum(calls) == ref_calls[0], "chunked: every position once, at most 7 per call"
    # each token's log-sum-exp never spans tokens: equal up to float32 rounding (a 7-row head matmul may be blocked
    # differently from a 45-row one: bit-equal on the Intel hosts, 1-ulp differences measured on an AMD EPYC)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)
    assert_same_as_per_row(got, ref, entropy, ref_entropy, grads, ref_grads, mask[:, -c:].bool())


def test_unrepeated_kv_heads_save_less_for_the_same_values_and_gradients() -> None:
    """On CPU the shared-prefix pass's attention saves the model's 2 KV heads, not 4 repeated ones; same result."""
    import os

    model = tiny_policy()
    model.train()
    ids, mask, c = head_batch(tail_lens=(0, 3, 8), group=6)
    weight = torch.randn(ids.size(0), c)

    def run(unrepeated: bool):  # type: ignore[no-untyped-def]
        saved: dict[int, int] = {}

        def pack(t):  # type: ignore[no-untyped-def]
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        context = unrepeated_kv_heads(torch.device("cpu")) if unrepeated else token_chunked_head(0)
        with context, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logps, entropy = shared_prefix_logps(model, ids, mask, c, compute_entropy=True)
        ((logps * weight + entropy) * mask[:, -c:]).sum().backward()
        return logps.detach(), entropy.detach(), lora_grads(model), sum(saved.values())

    ref, ref_entropy, ref_grads, ref_bytes = run(False)
    got, entropy, grads, got_bytes = run(True)
    assert "TRANSFORMERS_SDPA_FORCE_GQA" not in os.environ, "the switch is only on inside the context"
    assert got_bytes < ref_bytes * 0.95, (got_bytes, ref_bytes)
    assert_same_as_per_row(got, ref, entropy, ref_entropy, grads, ref_grads, mask[:, -c:].bool())


def test_chunked_logprobs_splits_targets_with_hidden() -> None:
    """Each call gets its own rows' targets: a kernel that reads target i at hidden row i sees the same pairs."""

    class Echo:
        @staticmethod
        def apply(hidden, weight, bias, targets, *rest):  # type: ignore[no-untyped-def]
            assert hidden.size(0) == targets.size(0) and rest == ("t",)
            return hidden[:, 0] * 1000 + targets, None

    hidden = torch.arange(10.0)[:, None].repeat(1, 3)
    targets = torch.arange(10) % 4
    got, none = chunked_logprobs(Echo, 3, hidden, torch.zeros(5, 3), None, targets, "t")
    assert none is None
    torch.testing.assert_close(got, torch.arange(10.0) * 1000 + targets)
    with pytest.raises(ValueError, match="tokens=-1"):
        chunked_logprobs(Echo, -1, hidden, torch.zeros(5, 3), None, targets, "t")


def test_a_real_step_in_small_micro_batches_and_head_chunks_is_the_same_update(
    tmp_path, monkeypatch, kernel_calls
):  # type: ignore[no-untyped-def]
    """Through :class:`LightningTrainer` (2 groups of 4, dapo, shared prefix): 2 rows per micro-batch and 4 tokens
    per head call give the one-micro-batch step's loss and LoRA gradient, and the head calls are that small."""
    from dataclasses import dataclass

    import test_loss_invariance as invariance

    from agentforge.trainers import grpo_config

    reference = invariance.run_step(tmp_path / "one", "dapo", True, 2, 1)
    assert max(kernel_calls) > 4, "the reference step's head runs unchunked"

    splits: list[int] = []

    @dataclass
    class SmallSteps(TrainConfig):
        max_rows_per_micro_batch: int = 2
        logprob_chunk_tokens: int = 4

        def __post_init__(self) -> None:
            super().__post_init__()
            splits.append(self.gradient_accumulation_steps)

    monkeypatch.setattr(grpo_config, "TrainConfig", SmallSteps)
    kernel_calls.clear()
    history: list[dict] = []
    got = invariance.run_step(tmp_path / "small", "dapo", True, 2, 1, history=history)
    assert max(kernel_calls) <= 4, "every head call of the step projects at most logprob_chunk_tokens tokens"
    assert splits == [4], "8 rows in micro-batches of at most 2: 4 micro-batches"
    assert got[2] == 4, (
        "each micro-batch holds 2 rows of one group, so each goes through the shared-prefix pass"
    )
    invariance._assert_same("2 rows per micro-batch, 4 tokens per head call", got, reference)
