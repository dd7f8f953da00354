"""Contract from public bug reports (issue 36, "KL after a warm start"): GRPO with β > 0 that starts from a warm
start adapter measures its KL against that adapter, not the base model, so at learning rate 0 the KL of the first
step is ≈ 0. Real TRL steps on the tiny model over stored groups.

Against the base model the same rows would show a KL well above 0 (the warm start moved the policy), which this
test measures too, so it fails if the reference is ever the base while a warm-start adapter serves.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from stored_groups import own_logprobs, stored_group_trainer
from tiny_model import PROMPT, scored_rollout, tiny_model

from agentforge.testing import memory_store

AGENT = "kl-warm"
COMPLETIONS = (([57, 1431, 2], 1.0), ([36, 2], 0.0))


def _adapter_logprobs(adapter: Path, completion: list[int]) -> list[float]:
    """The warm-start policy's (tiny model + ``adapter``) log-probabilities of ``completion`` after ``PROMPT``."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model()), str(adapter))
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + completion])).logits[0, len(PROMPT) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


@pytest.mark.slow
def test_grpo_from_a_warm_start_at_learning_rate_zero_has_kl_zero_at_step_zero(tmp_path: Path) -> None:
    import math

    store = memory_store()
    for completion, reward in COMPLETIONS:
        scored_rollout(store, AGENT, "g", completion, reward)
    warm, published = stored_group_trainer(tmp_path / "warm", store, AGENT, learning_rate=0.2, beta=0.0)
    warm.train()
    (adapter,) = published.dirs

    # the warm start moved the policy: k3(base ‖ warm) per token (DeepSeekMath's KL estimator) is clearly above 0
    k3 = []
    for completion, _ in COMPLETIONS:
        for ref, pol in zip(own_logprobs(completion), _adapter_logprobs(adapter, completion), strict=True):
            k3.append(math.exp(ref - pol) - (ref - pol) - 1)
    assert sum(k3) / len(k3) > 1e-3, k3

    grpo, _ = stored_group_trainer(
        tmp_path / "grpo", store, AGENT, init_adapter=str(adapter), learning_rate=0.0, beta=0.04
    )
    grpo.train()
    (row,) = [r for r in grpo.history if "kl" in r]
    assert abs(row["kl"]) < 1e-6, row  # the reference is the warm start the step began from
