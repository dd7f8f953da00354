"""Issue 35, item 1: tokens a grammar forced in a guided call train nothing.

A guided call's span (flag ``guided_logprobs_recomputed``) keeps the grammar-masked logprobs in
``attributes["guided_logprobs"]``; a token whose masked logprob is exactly 0.0 was chosen by the grammar, not the
policy. Such tokens stay in the sequence but get loss mask 0 in GRPO's samples (not in the SFT/export ones), and
a real step on the tiny model is unchanged when only the forced tokens change (their stored logprobs, and the
ids of the trailing ones): they add nothing to the loss or the gradient.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from stored_groups import own_logprobs, store_rollout, stored_group_trainer

from agentforge.testing import memory_store
from agentforge.trainers.samples import (
    GUIDED_LOGPROBS_ATTRIBUTE,
    SampleValidationError,
    build_trajectories,
    grpo_sample,
    trajectory_sample,
)
from agentforge.types import LLMCall, Span, SpanKind

RECOMPUTED = "guided_logprobs_recomputed"
AGENT = "forced"


def _guided(seq: int, prompt: list[int], completion: list[int], masked: object, **kw: Any) -> Span:
    logprobs = kw.pop("logprobs", [-0.5] * len(completion))
    flags = kw.pop("flags", [RECOMPUTED])
    call = LLMCall(
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=logprobs,
        version="policy@v1",
        flags=flags,
    )
    attributes = {} if masked is None else {GUIDED_LOGPROBS_ATTRIBUTE: masked}
    return Span(rollout_id="ro-1", kind=SpanKind.llm, llm=call, sequence=seq, attributes=attributes)


def test_forced_tokens_get_loss_mask_0_in_grpo_samples_only() -> None:
    # a forced tool call: the grammar fixed tokens 11, 12 and 14 (masked logprob 0.0), the model chose 10 and 13
    turn1 = _guided(1, [1, 2, 3], [10, 11, 12, 13, 14], [-1.2, 0.0, -0.0, -0.3, 0.0])
    turn2 = _guided(2, [1, 2, 3, 10, 11, 12, 13, 14, 50, 51], [15, 16], [0.0, -2.0])  # after a tool result
    (traj,) = build_trajectories([turn1, turn2])
    assert traj.env_mask == [
        1,
        1,
        1,
        1,
        1,
        0,
        0,
        1,
        1,
    ]  # the engine sampled all of them; 50, 51 are the tool's
    assert traj.forced == [False, True, True, False, True, False, False, True, False]
    assert traj.loss_mask == [1, 0, 0, 1, 0, 0, 0, 0, 1]
    assert traj.sampled_tokens == 7 and traj.forced_tokens == 4
    sample = grpo_sample(traj, 1.0, "ro-1")
    assert sample["env_mask"] == traj.loss_mask
    assert (
        sample["completion_ids"] == traj.completion_ids and sample["logprobs"] == traj.logprobs
    )  # kept as context
    assert sample["temperature"] == traj.temperatures
    # replay SFT and the dataset export learn the structure the grammar imposed: their mask is env_mask
    assert trajectory_sample(traj, 1.0, "ro-1")["env_mask"] == traj.env_mask


def test_only_recomputed_guided_spans_with_masked_logprobs_force_anything() -> None:
    plain = _guided(1, [1, 2, 3], [10, 11], None)  # a guided call as today's gateway stores it: no attribute
    unflagged = _guided(1, [1, 2, 3], [10, 11], [0.0, 0.0], flags=[])
    for span in (plain, unflagged):
        (traj,) = build_trajectories([span])
        assert traj.forced == [False, False] and grpo_sample(traj, 0.0, "ro-1")["env_mask"] == [1, 1]


@pytest.mark.parametrize("masked", [[0.0], [0.0, "x"], "0.0,0.0"])
def test_malformed_masked_logprobs_are_a_validation_error(masked: object) -> None:
    with pytest.raises(SampleValidationError, match=GUIDED_LOGPROBS_ATTRIBUTE):
        build_trajectories([_guided(1, [1, 2, 3], [10, 11], masked)])


# --- a real step on the tiny model ------------------------------------------------------------------------------
#: completion ids, forced positions, reward: one group of two guided rollouts
GROUP = [([57, 1431, 30, 44, 2], [1, 2, 4], 1.0), ([36, 88, 90, 2], [1, 3], 0.0)]


def _store(shift: float, trailing: int):  # type: ignore[no-untyped-def]
    """The group, the forced tokens' stored logprobs moved by ``shift``, each trailing forced id ``trailing``."""
    store = memory_store()
    for completion, forced, reward in GROUP:
        completion = completion[:-1] + [trailing]  # the last token is forced in both
        logprobs = [lp + (shift if k in forced else 0.0) for k, lp in enumerate(own_logprobs(completion))]
        masked = [0.0 if k in forced else lp - 0.1 for k, lp in enumerate(logprobs)]
        attributes = {GUIDED_LOGPROBS_ATTRIBUTE: masked}
        store_rollout(
            store, AGENT, "g", completion, reward, logprobs, flags=[RECOMPUTED], attributes=attributes
        )
    return store


def _step(out: Path, shift: float, trailing: int):  # type: ignore[no-untyped-def]
    """One real step (learning rate 0, no clipping): ``(LoRA gradients, logged loss, history row)``."""
    from transformers import TrainerCallback

    grads: dict[str, torch.Tensor] = {}

    class Capture(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            grads.update({n: p.grad.clone() for n, p in kw["model"].named_parameters() if p.requires_grad})

    trainer, _ = stored_group_trainer(
        out, _store(shift, trailing), AGENT, learning_rate=0.0, max_grad_norm=0.0
    )
    trainer.trainer.add_callback(Capture())
    trainer.train()
    (row,) = trainer.history
    return grads, row["loss"], row


def test_forced_tokens_add_nothing_to_a_real_step(tmp_path: Path) -> None:
    grads, loss, row = _step(tmp_path / "a", 0.0, 2)
    assert row["batch/forced_token_share"] == pytest.approx(5 / 9)  # 5 of the 9 sampled tokens were forced
    assert any(float(g.abs().sum()) > 0 for g in grads.values())  # the free tokens carry the group's signal
    moved, moved_loss, _ = _step(tmp_path / "b", -0.2, 1431)  # only forced tokens differ
    assert moved_loss == pytest.approx(loss, rel=1e-6, abs=1e-9)
    assert grads.keys() == moved.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(moved[name], grad, rtol=1e-5, atol=1e-9, msg=lambda m, n=name: f"{n}: {m}")
