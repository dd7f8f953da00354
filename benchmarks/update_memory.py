"""Peak memory of one GRPO update at airline-sized trajectories: micro-batched vs one batch of every rollout.

What ``agentforge train`` runs for one optimizer step (its own :class:`TrainConfig`: LoRA r=16 all-linear, bf16
autocast, no gradient checkpointing, shared-prompt log-probs, TRL's update), on stored samples instead of live
rollouts: no engine, no gateway. Each (arm, rollouts) runs in a fresh subprocess, which reports its peak
resident memory (``getrusage`` ``ru_maxrss``: model, optimizer and the update; GB = 10⁹ bytes) and the
update's seconds (the optimizer step, measured by a callback).

**Samples.** Shaped like τ-airline's (about 1,300 prompt tokens, multi-turn tool loops): every prompt is a common head (system prompt and
tool schemas, ``--prompt-tokens`` − ``--tail-tokens`` tokens) and a per-task tail (``--tail-tokens``); each
rollout's completion has ``--completion-tokens`` tokens, a tool call, a tool result (mask 0, attended, not
scored) and a reply, a third each. Token ids are drawn uniformly from ``[3, vocab)`` by a seeded
``torch.Generator`` (memory and time do not depend on the values). ``--group-size`` rollouts per task; 8 and
32 rollouts a step are 1 and 4 tasks of 8. Rewards differ within a group, so every row has an advantage.

**Arms.** *new*: the defaults (``max_rows_per_micro_batch`` 8 with whole groups per micro-batch, the LM head in
calls of 512 tokens, CPU attention on the 3 KV heads: :mod:`agentforge.trainers.logp_memory`); *old*: every
rollout of the step in one micro-batch, TRL's LM head call and transformers' repeated KV heads
(``max_rows_per_micro_batch=0``, ``logprob_chunk_tokens=0``, ``TRANSFORMERS_SDPA_FORCE_GQA=0``). The old arm
at a larger size is skipped when its estimate (:func:`estimate_gb`, from its largest measured size) passes
``--old-cap-gb``.

    python benchmarks/update_memory.py                          # 8 and 32 rollouts, both arms (~10 min, 2 cores)
    python benchmarks/update_memory.py --rollouts 8 --arms new

Measured here (2 shared CPU cores, load 4-12 from other jobs, 2026-12-05)::

    rollouts | new: micro-batches, peak GB, s     | old: micro-batches, peak GB, s
           8 |   1    4.82 GB    84.7 s           |   1    6.08 GB    95.0 s
          32 |   4    5.50 GB  1126.0 s           | skipped: would exceed 14 GB (est. 22.2)

The 32-rollout child was stopped (SIGSTOP, from outside) for several minutes of its step; earlier runs of the
same arm took 133 and 439 s. Seconds on this machine are not comparable between runs; memory is.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ARMS = {
    "new": {},
    "old": {"max_rows_per_micro_batch": 0, "logprob_chunk_tokens": 0},
}
#: The old arm's attention: transformers' own choice (repeated KV heads), not :func:`unrepeated_kv_heads`'s.
OLD_ATTENTION = {"TRANSFORMERS_SDPA_FORCE_GQA": "0"}


def airline_groups(
    vocab: int, tasks: int, group_size: int, prompt_tokens: int, tail_tokens: int, completion_tokens: int
) -> dict[str, list[Any]]:
    """``tasks`` groups of ``group_size`` synthetic trajectories (module docstring, **Samples**).

    Returns:
        Group id → its :class:`~agentforge.trainers.samples.Trajectory` list; prompts are
        ``prompt_tokens`` long, completions ``completion_tokens`` (the middle third env-masked).
    """
    import torch

    from agentforge.trainers.samples import Trajectory

    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    head = ids(prompt_tokens - tail_tokens)
    third = completion_tokens // 3
    mask = [1] * third + [0] * third + [1] * (completion_tokens - 2 * third)
    groups = {}
    for task in range(tasks):
        prompt = head + ids(tail_tokens)
        groups[f"task{task}"] = [
            Trajectory(
                f"task{task}-{k}",
                prompt,
                ids(completion_tokens),
                [-1.0 if m else 0.0 for m in mask],
                mask,
                versions=["policy@v0"],
            )
            for k in range(group_size)
        ]
    return groups


class _Publisher:
    def current(self) -> str:
        return "policy@v0"

    def publish(self, adapter_dir: Path, step: int) -> str:
        return "policy@v1"


def one_update(args: argparse.Namespace, rollouts: int) -> dict[str, Any]:
    """One optimizer step in this process; returns rollouts, micro-batches, peak GB and the step's seconds."""
    import torch
    from transformers import AutoConfig, TrainerCallback

    from agentforge.commands.train import _config
    from agentforge.model import prepare_default_model
    from agentforge.testing import memory_store
    from agentforge.trainers.grpo_trainer import LightningTrainer
    from agentforge.trainers.rollouts import FixedGroups

    torch.set_num_threads(args.threads) if args.threads else None
    model = args.model or prepare_default_model()
    vocab = AutoConfig.from_pretrained(model).vocab_size
    tasks = rollouts // args.group_size
    groups = airline_groups(
        vocab, tasks, args.group_size, args.prompt_tokens, args.tail_tokens, args.completion_tokens
    )
    with tempfile.TemporaryDirectory() as out:
        config = _config(
            Path(out), 1, args.group_size, tasks, 1, 1e-5, 16, args.completion_tokens, 0, **ARMS[args.arm]
        )
        rewards = {name: [k / args.group_size for k in range(args.group_size)] for name in groups}
        source = FixedGroups(groups, rewards, run_id="update-memory")
        trainer = LightningTrainer(
            model, memory_store(), None, config, _Publisher(), source=source, swap_during_training=False
        )
        clock: list[float] = []

        class Clock(TrainerCallback):
            def on_step_begin(self, *a: Any, **k: Any) -> None:
                clock.append(time.perf_counter())

            def on_step_end(self, *a: Any, **k: Any) -> None:
                clock.append(time.perf_counter())

        trainer.trainer.add_callback(Clock())
        base_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # model, LoRA, trainer
        trainer.trainer.train()
    return {
        "arm": args.arm,
        "rollouts": rollouts,
        "micro_batches": config.gradient_accumulation_steps,
        "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
        "base_gb": base_gb,
        "seconds": clock[1] - clock[0],
    }


def run_child(args: argparse.Namespace, arm: str, rollouts: int) -> dict[str, Any]:
    """:func:`one_update` in a fresh interpreter (its own peak RSS)."""
    argv = [sys.executable, __file__, "--child", "--arm", arm, "--rollouts", str(rollouts)]
    for name in ("group_size", "prompt_tokens", "tail_tokens", "completion_tokens", "threads"):
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    argv += ["--model", str(args.model)] if args.model else []
    env = {**os.environ, **(OLD_ATTENTION if arm == "old" else {})}
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        raise RuntimeError(f"{arm} at {rollouts} rollouts failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def estimate_gb(done: dict[str, Any], rollouts: int) -> float:
    """An arm's peak at ``rollouts``, from one measured run: its base (model, trainer) plus the update's share
    scaled with the rows (the update's activations, KV cache and head transients all grow with them)."""
    return float(done["base_gb"] + (done["peak_gb"] - done["base_gb"]) * rollouts / done["rollouts"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rollouts", type=int, nargs="+", default=[8, 32], help="rollouts per step (rows)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=1300)
    p.add_argument("--tail-tokens", type=int, default=200, help="of the prompt, distinct per task")
    p.add_argument("--completion-tokens", type=int, default=100)
    p.add_argument("--model", type=Path, default=None, help="checkpoint (default: the prepared SmolLM2-135M)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--old-cap-gb", type=float, default=14.0)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--arm", default="new", choices=list(ARMS), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(one_update(args, args.rollouts[0])))
        return
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for arm in args.arms:
        for rollouts in sorted(args.rollouts):
            done = [r for (a, _), r in rows.items() if a == arm and "peak_gb" in r]
            guess = estimate_gb(done[-1], rollouts) if done else 0.0
            skip = arm == "old" and guess > args.old_cap_gb
            rows[(arm, rollouts)] = {"estimate_gb": guess} if skip else run_child(args, arm, rollouts)
    print(
        f"one GRPO update, {args.prompt_tokens} prompt + {args.completion_tokens} completion tokens a rollout, "
        f"group {args.group_size}; peak RSS in GB (10^9 bytes)"
    )
    head = f"{'rollouts':>8} | " + " | ".join(
        f"{arm + ': micro-batches, peak GB, s':<34}" for arm in args.arms
    )
    print(head)
    for rollouts in sorted(args.rollouts):
        cells = []
        for arm in args.arms:
            r = rows[(arm, rollouts)]
            cells.append(
                f"{r['micro_batches']:>3} {r['peak_gb']:>7.2f} GB {r['seconds']:>7.1f} s"
                if "peak_gb" in r
                else f"skipped: would exceed {args.old_cap_gb:g} GB (est. {r['estimate_gb']:.1f})"
            )
        print(f"{rollouts:>8} | " + " | ".join(f"{c:<34}" for c in cells))


if __name__ == "__main__":
    main()
