"""Issue 35, item 1: every logged step carries the learning diagnostics, with values that mean what they say.

Real TRL steps on the tiny model over stored groups whose stored logprobs are the model's own (importance
ratio 1) except one token's, moved by +1 nat (ratio e⁻¹ ≈ 0.37, outside [0.5, 2]): ``train/update_ratio`` is
``‖Δθ‖/‖θ‖`` of the LoRA weights measured around the step, positive with signal and exactly 0 without (beta 0);
``batch/signal_group_share`` is the share of groups whose rewards differ; ``/outside_share`` counts that token.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from stored_groups import own_logprobs, store_rollout, stored_group_trainer

from agentforge.testing import memory_store
from agentforge.trainers.diagnostics import update_size

AGENT = "diagnostics"
COMPLETIONS = ([57, 1431, 2], [36, 2])


def _run(tmp_path: Path, rewards: dict[str, tuple[float, float]], **config_kw: object):  # type: ignore[no-untyped-def]
    store = memory_store()
    for group, pair in rewards.items():
        for i, (completion, reward) in enumerate(zip(COMPLETIONS, pair, strict=True)):
            logprobs = own_logprobs(completion)
            if i == 0:
                logprobs[0] += 1.0  # the engine was surer of this token than the trainer: raw ratio e^-1
            store_rollout(store, AGENT, group, completion, reward, logprobs)
    trainer, _ = stored_group_trainer(tmp_path, store, AGENT, tasks_per_step=len(rewards), **config_kw)
    lora = [p for n, p in trainer.trainer.model.named_parameters() if p.requires_grad]
    before = [p.detach().clone() for p in lora]
    trainer.train()
    (row,) = trainer.history
    return row, update_size(before, [p.detach() for p in lora])


def test_a_step_with_signal_logs_its_size_entropy_ratio_tails_and_signal_share(tmp_path: Path) -> None:
    row, measured = _run(tmp_path, {"g1": (1.0, 0.0), "g2": (1.0, 1.0)}, learning_rate=1e-3)
    assert row["train/update_ratio"] > 0 and row["train/update_norm"] > 0
    assert row["train/update_ratio"] == pytest.approx(measured["train/update_ratio"], rel=1e-6)
    assert row["train/update_norm"] == pytest.approx(measured["train/update_norm"], rel=1e-6)
    assert row["batch/signal_group_share"] == 0.5  # g1's rewards differ, g2's do not
    assert row["batch/zero_variance_share"] == 0.5
    assert 0 < row["entropy"] <= math.log(49152) + 1e-3  # TRL's, nats, at most the uniform distribution's
    assert row["sampling/raw_importance_ratio/outside_share"] == pytest.approx(
        2 / 10
    )  # 1 token of 5, per group
    assert row["sampling/raw_importance_ratio/min"] == pytest.approx(math.exp(-1.0), rel=1e-4)
    assert row["sampling/raw_importance_ratio/max"] == pytest.approx(1.0, abs=1e-4)


def test_a_step_without_signal_moves_nothing(tmp_path: Path) -> None:
    row, measured = _run(
        tmp_path, {"g1": (1.0, 1.0)}, learning_rate=1e-3, beta=0.0, publish_without_signal=True
    )
    assert (
        row["train/update_ratio"] == 0.0
        and row["train/update_norm"] == 0.0
        and measured["train/update_norm"] == 0
    )
    assert row["batch/signal_group_share"] == 0.0
