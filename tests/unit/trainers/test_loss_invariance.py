"""Issue 15, item 1: the GRPO update does not depend on how a step's batch is split.

Bugs guarded (each reported in a peer trainer; none crashes, each silently changes what is learned):

* a token-normalised loss — already each micro-batch's share of the global token mean — divided again by the
  accumulation count, so the effective learning rate depended on ``gradient_accumulation_steps``;
* a token-count normaliser spanning ``steps_per_generation`` micro-steps while gradients accumulate over a
  different count (agentforge generates once per optimizer step: :class:`TrainConfig` refuses a
  ``steps_per_generation`` that differs from the accumulation, it never silently overrides it);
* ``gradient_accumulation_steps`` silently multiplying the tasks of a step instead of splitting them (the
  update then depends on the accumulation count through the batch, not only through the normaliser);
* tool-output tokens (``env_mask`` 0) counted in a denominator or a numerator;
* a loss type whose normaliser is local to a micro-batch (TRL's ``bnpo``) accepted although its update
  changes with the split.

One step's batch: two groups of 4 completions with 1, 3, 5 and 7 trainable tokens and fixed rewards (so
fixed group-relative advantages), the 7-token one with 4 tool-output tokens in the middle. Its LoRA gradient
(captured before the optimizer step, learning rate 0, no clipping) and logged loss are computed through the
real :class:`LightningTrainer` on a tiny random Llama, (a) in one micro-batch, (b) with accumulation 8 (one
completion per micro-batch), (d) on 2 processes over gloo (``torch.multiprocessing`` spawn, one group each),
for every loss type agentforge offers and both log-prob paths (TRL's per-row pass, the shared-prefix pass).
"""

from __future__ import annotations

import math
import os
import re
import socket
import sys
from pathlib import Path

import pytest
import torch
from tiny_model import tiny_model

from agentforge.errors import ConfigError
from agentforge.testing import memory_store
from agentforge.trainers.rollouts import FixedGroups
from agentforge.trainers.samples import Trajectory

G = 4
SAMPLED = [1, 3, 5, 7]  # trainable tokens per completion
TOOL_GAP = 4  # tool-output tokens (mask 0) inside the 7-token completion, after its first 3
REWARDS = {"g0": [1.0, 0.0, 0.5, 0.25], "g1": [0.0, 0.2, 1.0, 0.6]}
PROMPTS = {"g0": [1, 4093, 198, 6004, 2, 198, 1, 520], "g1": [1, 4093, 198, 57, 1431, 30, 2, 198, 1, 520]}
_ENV_LOGPROB = 0.0  # the log-prob stored on tool-output tokens (agentforge stores 0.0)
#: Loss types agentforge offers (TRL 1.16's, less ``bnpo``), with the settings each needs.
LOSS_TYPES = {
    "dapo": {},
    "grpo": {},
    "dr_grpo": {},
    "cispo": {},
    "sapo": {},
    "luspo": {"importance_sampling_level": "sequence"},
    "vespo": {"vllm_importance_sampling_mode": "token_truncate"},
}


def _trajectories(model_dir: Path) -> dict[str, list[Trajectory]]:
    """The two groups, with the tiny model's own log-probs (shifted a little, so importance ratios are not 1)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    out: dict[str, list[Trajectory]] = {}
    for g, (name, prompt) in enumerate(PROMPTS.items()):
        trajs = []
        for i, n in enumerate(SAMPLED):
            ids = [100 + 7 * g + 11 * i + k for k in range(n + (TOOL_GAP if n == 7 else 0))]
            mask = [1] * len(ids)
            if n == 7:
                mask[3 : 3 + TOOL_GAP] = [0] * TOOL_GAP
            with torch.no_grad():
                logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
            logps = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
            stored = [
                float(lp) + 0.05 * (k % 3) if m else _ENV_LOGPROB
                for k, (lp, m) in enumerate(zip(logps.tolist(), mask, strict=True))
            ]
            trajs.append(Trajectory(f"{name}-{i}", list(prompt), ids, stored, mask, versions=["policy@v0"]))
        out[name] = trajs
    return out


class _Publisher:
    def current(self) -> str:
        return "policy@v0"

    def publish(self, adapter_dir: Path, step: int) -> str:
        return "policy@v1"


def _config(out: Path, loss_type: str, share: bool, tasks_per_step: int, accumulation: int):  # type: ignore[no-untyped-def]
    from agentforge.trainers.grpo_config import TrainConfig

    return TrainConfig(
        output_dir=str(out),
        num_generations=G,
        tasks_per_step=tasks_per_step,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        learning_rate=0.0,
        max_grad_norm=0.0,
        lora_r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        max_completion_length=16,
        gradient_checkpointing=False,
        loss_type=loss_type,
        share_prompt_prefix=share,
        **LOSS_TYPES[loss_type],
    )


def run_step(out: Path, loss_type: str, share: bool, tasks_per_step: int, accumulation: int, history=None):  # type: ignore[no-untyped-def]
    """One optimizer step; returns ``(lora_gradients, logged_loss, shared_prefix_calls)`` (gradients on CPU).

    ``history``, a list, receives the step's logged rows and ``{"old_pass_skips": n}``.
    """
    from transformers import TrainerCallback

    from agentforge.trainers.grpo_trainer import LightningTrainer

    model_dir = tiny_model()
    grads: dict[str, torch.Tensor] = {}

    class Capture(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            for name, p in kw["model"].named_parameters():
                if p.requires_grad:
                    grads[name.removeprefix("module.")] = p.grad.detach().clone()

    config = _config(out, loss_type, share, tasks_per_step, accumulation)
    trainer = LightningTrainer(
        model_dir,
        memory_store(),
        None,
        config,
        _Publisher(),
        source=FixedGroups(_trajectories(model_dir), REWARDS, run_id="run-invariance"),
        swap_during_training=False,
    )
    trainer.trainer.add_callback(Capture())
    trainer.trainer.train()
    loss = next(row["loss"] for row in trainer.trainer.state.log_history if "loss" in row)  # every rank logs
    if history is not None:
        history.extend(
            [*trainer.trainer.state.log_history, {"old_pass_skips": trainer.trainer.old_pass_skips}]
        )
    return grads, loss, getattr(trainer.trainer, "shared_prefix_calls", 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, out: str, cases: list[tuple[str, bool]], threads: int) -> None:
    """One of 2 gloo ranks (``mp.spawn`` target): each case one step, one group per rank; rank 0 saves.
    ``threads``: the parent's torch threads, so both sides sum in the same order (a near-zero loss is a sum of
    cancelling terms: another thread count moves it by more than the tolerance)."""
    torch.set_num_threads(threads)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        ACCELERATE_USE_CPU="true",
        OMP_NUM_THREADS="1",
        TRL_EXPERIMENTAL_SILENCE="1",
    )
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
    results = {}
    for loss_type, share in cases:
        results[(loss_type, share)] = run_step(Path(out) / f"{loss_type}-{share}", loss_type, share, 1, 1)
    if rank == 0:
        torch.save(results, Path(out) / "ddp.pt")


def _assert_same(case: str, got, want) -> None:  # type: ignore[no-untyped-def]
    grads, loss, _ = got
    ref_grads, ref_loss, _ = want
    assert set(grads) == set(ref_grads), case
    assert math.isclose(loss, ref_loss, rel_tol=1e-4, abs_tol=1e-7), (
        f"{case}: logged loss {loss} != {ref_loss}"
    )
    for name, ref in ref_grads.items():
        torch.testing.assert_close(
            grads[name], ref, rtol=1e-4, atol=1e-7, msg=lambda m, n=name: f"{case}, {n}: {m}"
        )


def _has_gradient(result) -> bool:  # type: ignore[no-untyped-def]
    return any(float(g.abs().sum()) > 0 for g in result[0].values())


#: The default path (dapo, shared prefix) and TRL's per-row pass: fast. Every other loss type: slow.
FAST = [("dapo", True), ("dapo", False)]
CASES = FAST + [(lt, True) for lt in LOSS_TYPES if lt != "dapo"]
#: On 2 processes: one loss per normaliser family (global token count, per-sequence mean, constant).
DDP_CASES = [*FAST, ("grpo", True), ("dr_grpo", True)]


@pytest.fixture(scope="module")
def one_micro_batch(tmp_path_factory):  # type: ignore[no-untyped-def]
    """(a), computed on demand: the whole step (2 groups × 4 completions) in one micro-batch."""
    tmp, done = tmp_path_factory.mktemp("one-micro-batch"), {}

    def get(loss_type: str, share: bool):  # type: ignore[no-untyped-def]
        if (loss_type, share) not in done:
            done[(loss_type, share)] = run_step(tmp / f"{loss_type}-{share}", loss_type, share, 2, 1)
            assert _has_gradient(done[(loss_type, share)]), f"{loss_type}: the reference step has no gradient"
        return done[(loss_type, share)]

    return get


@pytest.mark.parametrize(("loss_type", "share"), FAST)
def test_accumulation_gives_the_same_gradient_and_loss(tmp_path, one_micro_batch, loss_type, share) -> None:
    """(b): accumulation 8, one completion per micro-batch, equals (a) — the default loss, both log-prob paths."""
    reference = one_micro_batch(loss_type, share)
    assert (reference[2] > 0) == share, "the shared-prefix pass ran exactly when configured"
    _assert_same(f"{loss_type} accumulation 8", run_step(tmp_path, loss_type, share, 2, 8), reference)


@pytest.mark.slow
def test_every_loss_type_is_invariant_to_accumulation(tmp_path, one_micro_batch) -> None:
    """(b) for every other loss type agentforge offers (shared-prefix path, the default)."""
    for loss_type, share in CASES[len(FAST) :]:
        got = run_step(tmp_path / loss_type, loss_type, share, 2, 8)
        _assert_same(f"{loss_type} accumulation 8", got, one_micro_batch(loss_type, share))


@pytest.mark.slow
def test_two_processes_give_the_same_gradient_and_loss(tmp_path, one_micro_batch) -> None:
    """(d): 2 processes over gloo, one group each (DDP averages their gradients), equal (a): each normaliser
    family (dapo's global token count over both log-prob paths, grpo's per-sequence mean, dr_grpo's constant)."""
    import torch.multiprocessing as mp

    mp.spawn(
        _rank, args=(_free_port(), str(tmp_path), DDP_CASES, torch.get_num_threads()), nprocs=2, join=True
    )
    ddp = torch.load(tmp_path / "ddp.pt")
    for case in DDP_CASES:
        _assert_same(f"{case} on 2 processes", ddp[case], one_micro_batch(*case))


def test_masked_tokens_count_in_neither_numerator_nor_denominator(tmp_path, one_micro_batch) -> None:
    """The logged dapo loss is the mean over sampled tokens only, and tool-output log-probs change nothing.

    At the first step the policy ratio is 1, so TRL's dapo loss is ``-Σ_i n_i A_i w_i / Σ_i n_i`` over the
    completions ``i`` with ``n_i`` sampled tokens, advantage ``A_i = (r_i - mean) / (std + 1e-4)`` within the
    group and importance weight ``w_i = exp(Σ (logp_train - logp_stored))`` over its sampled tokens (TRL's
    ``sequence_mask`` mode). Counting the 4 tool-output tokens would put 40 instead of 32 in the denominator.
    """
    grads, loss, _ = one_micro_batch("dapo", True)
    numerator, sampled = 0.0, 0
    for name in PROMPTS:
        rewards = torch.tensor(REWARDS[name])
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
        for i, n in enumerate(SAMPLED):
            positions = list(range(n)) if n != 7 else [0, 1, 2, *range(3 + TOOL_GAP, 7 + TOOL_GAP)]
            weight = math.exp(-0.05 * sum(k % 3 for k in positions))  # the stored log-probs' shift
            numerator += -n * float(advantages[i]) * weight
            sampled += n
    assert sampled == 32
    assert math.isclose(loss, numerator / sampled, rel_tol=1e-4), (loss, numerator / sampled)

    global _ENV_LOGPROB
    _ENV_LOGPROB = -50.0  # what a buggy source might store on tool tokens; they are masked, so nothing moves
    try:
        altered = run_step(tmp_path, "dapo", True, 2, 1)
    finally:
        _ENV_LOGPROB = 0.0
    _assert_same("tool-token log-probs changed", altered, (grads, loss, 0))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gradient_accumulation_steps": 3}, "must divide the step's tasks_per_step × num_generations = 8"),
        (
            {"gradient_accumulation_steps": 2, "steps_per_generation": 4},
            "samples one batch per optimizer step",
        ),
        ({"generation_batch_size": 16}, "leave both unset"),
        ({"loss_type": "bnpo"}, "use dapo"),
        ({"loss_type": "vespo"}, "vespo' needs vllm_importance_sampling_mode"),
    ],
)
def test_configs_whose_update_depends_on_the_split_are_refused(tmp_path, fields, message) -> None:
    """(c) and the rest: what would make the update depend on the split fails with the fix in the message."""
    from agentforge.trainers.grpo_config import TrainConfig

    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(output_dir=str(tmp_path), num_generations=G, tasks_per_step=2, use_cpu=True, **fields)


def test_accumulation_splits_the_step_instead_of_adding_tasks(tmp_path) -> None:
    """``gradient_accumulation_steps`` is a memory knob: a step still holds ``tasks_per_step`` groups."""
    from agentforge.trainers.grpo_config import TrainConfig

    for accumulation in (1, 2, 4, 8):
        config = TrainConfig(
            output_dir=str(tmp_path),
            num_generations=G,
            tasks_per_step=2,
            use_cpu=True,
            gradient_accumulation_steps=accumulation,
        )
        assert config.per_device_train_batch_size * accumulation == 2 * G
        assert config.steps_per_generation == accumulation
        assert config.generation_batch_size == 2 * G
