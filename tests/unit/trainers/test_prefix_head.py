"""The common head of all prompts runs once (``trainers/prefix.py``), and the importance ratio comes from the
training forward when the old policy is the trained one (``trainers/onpolicy_ratio.py``).

Log-probs, entropies and LoRA gradients of :func:`shared_prefix_logps` on a batch whose prompts share a head
and end in tails of different lengths (one empty) must equal TRL's per-row pass to float32 rounding, through
three model calls (head batch 1, tails, completions). A real :class:`LightningTrainer` step with TRL's
separate old-logprob pass and one with the ratio from the training forward log the same loss, ratio metrics
and LoRA gradient.
"""

from __future__ import annotations

import math

import pytest
import torch
from tiny_policy import VOCAB, assert_same_as_per_row, lora_grads, tiny_policy, trl_logps

from agentforge.trainers.onpolicy_ratio import TrainingForwardRatio, importance_ratio
from agentforge.trainers.prefix import MIN_HEAD_TOKENS, common_head_len, prompt_groups, shared_prefix_logps


def head_batch(head_len=7, tail_lens=(0, 3, 8), group=3, completion_len=5, seed=1):  # type: ignore[no-untyped-def]
    """Prompts ``head + tail + last token``, left-padded, each repeated ``group`` times; rows shuffled."""
    gen = torch.Generator().manual_seed(seed)
    head = torch.randint(3, VOCAB, (head_len,), generator=gen)
    prompts = [torch.cat([head, torch.randint(3, VOCAB, (t + 1,), generator=gen)]) for t in tail_lens]
    width = max(p.numel() for p in prompts)
    ids, masks = [], []
    for prompt in prompts:
        pad = width - prompt.numel()
        for _ in range(group):
            used = int(torch.randint(1, completion_len + 1, (), generator=gen))
            completion = torch.randint(3, VOCAB, (completion_len,), generator=gen)
            ids.append(torch.cat([torch.zeros(pad, dtype=torch.long), prompt, completion]))
            masks.append(
                torch.cat([torch.zeros(pad), torch.ones(prompt.numel()), torch.arange(completion_len) < used])
            )
    order = torch.randperm(len(ids), generator=gen)
    return torch.stack(ids)[order], torch.stack(masks).long()[order], completion_len


def test_common_head_is_the_longest_shared_prefix_leaving_each_last_token() -> None:
    ids, mask, c = head_batch(head_len=7, tail_lens=(0, 3, 8))
    assert common_head_len(prompt_groups(ids, mask, c)) == 7
    ids, mask, c = head_batch(head_len=7, tail_lens=(3,), group=4)  # one group: its prompt pass is the head
    assert common_head_len(prompt_groups(ids, mask, c)) == 0
    ids, mask, c = head_batch(head_len=MIN_HEAD_TOKENS - 1, tail_lens=(2, 5))
    assert common_head_len(prompt_groups(ids, mask, c)) == 0
    same = prompt_groups(*head_batch(head_len=6, tail_lens=(0, 0))[:2], c)  # prompts differ in the last token
    assert common_head_len(same) == 6


@pytest.mark.parametrize("tail_lens", [(0, 3, 8), (2, 2), (0, 0, 0)])
def test_head_path_values_and_gradients_equal_trl_per_row_pass(tail_lens) -> None:  # type: ignore[no-untyped-def]
    model = tiny_policy()
    model.train()
    ids, mask, c = head_batch(tail_lens=tail_lens)
    weight = torch.randn(ids.size(0), c)  # an arbitrary loss, so every position's gradient counts
    ref, ref_entropy = trl_logps(model, ids, mask, c)
    (ref * weight * mask[:, -c:]).sum().backward()
    ref_grads = lora_grads(model)
    calls: list[tuple[int, int]] = []
    hook = model.get_base_model().model.register_forward_hook(
        lambda module, args, kwargs, out: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    got, entropy = shared_prefix_logps(model, ids, mask, c, compute_entropy=True)
    hook.remove()
    (got * weight * mask[:, -c:]).sum().backward()
    got_grads = lora_grads(model)

    tail_width = max(tail_lens)
    want = [(1, 7)] + ([(len(tail_lens), tail_width)] if tail_width else []) + [(ids.size(0), c)]
    assert calls == want, "head once (batch 1), the tails (one batch), the completions"
    assert_same_as_per_row(got, ref, entropy, ref_entropy, got_grads, ref_grads, mask[:, -c:].bool())


def test_importance_ratio_modes() -> None:
    old = torch.tensor([[0.0, -1.0, -2.0], [-1.0, -1.0, 0.0]])
    stored = torch.tensor([[-1.0, -1.0, float("nan")], [0.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    token = importance_ratio(old, stored, mask, "token_truncate", None, 2.0)
    torch.testing.assert_close(token, torch.tensor([[2.0, 1.0, 1.0], [math.exp(-1), 1.0, 1.0]]))
    masked = importance_ratio(old, stored, mask, "token_mask", 0.5, 2.0)
    torch.testing.assert_close(masked, torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]]))
    sequence = importance_ratio(old, stored, mask, "sequence_truncate", None, None)
    torch.testing.assert_close(sequence, torch.tensor([[math.e], [math.exp(-1)]]))
    with pytest.raises(ValueError, match="unknown"):
        importance_ratio(old, stored, mask, "token", None, None)


def test_ratio_from_training_forward_equals_trl_old_logprob_pass(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """One real step (2 groups, one micro-batch, stored logprobs off the policy's): loss, gradient and the
    logged importance-ratio metrics are those of TRL's separate old-logprob pass, which did not run."""
    from test_loss_invariance import run_step

    keys = (
        "loss",
        "sampling/importance_sampling_ratio/mean",
        "sampling/importance_sampling_ratio/min",
        "sampling/importance_sampling_ratio/max",
        "sampling/sampling_logp_difference/mean",
        "sampling/raw_importance_ratio/max",
    )
    skipped: list[dict] = []
    got = run_step(tmp_path / "skip", "dapo", True, 2, 1, history=skipped)
    assert skipped[-1]["old_pass_skips"] == 1
    monkeypatch.setattr(TrainingForwardRatio, "_ratio_from_training_forward", lambda self: False)
    trl_pass: list[dict] = []
    want = run_step(tmp_path / "trl", "dapo", True, 2, 1, history=trl_pass)
    assert trl_pass[-1]["old_pass_skips"] == 0
    got_row, want_row = (next(r for r in rows if "loss" in r) for rows in (skipped, trl_pass))
    for key in keys:
        assert math.isclose(got_row[key], want_row[key], rel_tol=1e-5, abs_tol=1e-7), key
    assert want_row["sampling/importance_sampling_ratio/mean"] != 1.0, "the ratio must not be trivially 1"
    for name, ref in want[0].items():
        torch.testing.assert_close(got[0][name], ref, rtol=1e-4, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")
