"""Replay SFT step time: the shared prompt head run once per batch vs TRL's per-row pass, side by side.

Eight examples shaped like the order bot's warm-start turns (SmolLM2-135M-Instruct's tokenizer and weights,
LoRA r=16 all-linear, bf16 autocast, no gradient checkpointing, as in ``examples/main_job.py``): a common
head of ``--head`` tokens (system prompt, tool schemas, worked example), a distinct tail of ``--tail``
tokens per example (the customer's message), then a completion of ``3 × --part`` tokens: a sampled tool
call, the tool's answer (mask 0: attended, no loss) and a sampled reply. One optimizer step covers all
eight, in micro-batches given by ``--layouts`` (``2x4``: 2 rows × 4 accumulation steps, the main job's
warm start; ``8x1``: one batch of 8). Each (layout, mode) runs ``--steps`` optimizer steps in this process;
the first is warm-up, the script prints the median of the rest (seconds per step), peak RSS, and the ratio
shared/per-row per layout.

    python benchmarks/replay_sft_step.py --steps 3 --layouts 2x4,8x1

Measured on 2 shared cores (other jobs niced; 2026-12-02), 8 x 605 tokens: layout 2x4, per-row 24.6 s/step,
shared head 13.7 s/step (ratio 0.56; peak RSS 4.0 GiB). Layout 8x1 was not stable here (steps of one run
from 20 to 140 s, slowest first; probably first-touch of large allocations); peak RSS 12.7 GiB per-row vs 4.8 GiB shared.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import time
from pathlib import Path

import torch

from agentforge.model import prepare_default_model

TEXT = (
    "You are the order desk of an online shop. Use the tools to look up, change or cancel an order; answer "
    "the customer in one short sentence with the order's status. Tools: get_order(order_id) returns the "
    "order's items, address and status; change_order(order_id, items) replaces the items of a pending "
    "order; cancel_order(order_id, reason) cancels a pending order. "
)


def make_examples(tokenizer, args: argparse.Namespace) -> list[dict[str, list[int]]]:  # type: ignore[no-untyped-def]
    """``n`` examples: the same head, distinct tails, completions with a masked tool answer in the middle."""
    words = tokenizer(TEXT * 40, add_special_tokens=False)["input_ids"]
    head = words[: args.head]
    rng = random.Random(0)
    out = []
    for _ in range(args.examples):
        tail = rng.sample(words, args.tail)
        call, answer, reply = (rng.sample(words, args.part) for _ in range(3))
        ids = head + tail + call + answer + reply
        mask = [0] * (args.head + args.tail) + [1] * args.part + [0] * args.part + [1] * args.part
        out.append({"input_ids": ids, "completion_mask": mask})
    return out


def run(model: Path, data: list[dict], layout: str, share: bool, args: argparse.Namespace) -> list[float]:
    """Seconds per optimizer step of one (layout, mode)."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import SFTTrainer

    from agentforge.trainers.replay.prefix_sft import SharedPrefixSFTTrainer
    from agentforge.trainers.replay.sft_config import ReplaySFTConfig

    rows, accumulation = (int(x) for x in layout.split("x"))
    config = ReplaySFTConfig(
        output_dir=str(args.out / f"{layout}-{share}"),
        max_steps=args.steps,
        per_device_train_batch_size=rows,
        gradient_accumulation_steps=accumulation,
        learning_rate=5e-4,
        lr_scheduler_type="constant",
        lora_r=16,
        lora_alpha=32,
        max_length=1024,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=True,
        gradient_checkpointing=False,
        disable_tqdm=True,
        seed=0,
        dataset_num_proc=None,
        share_prompt_prefix=share,
    )
    steps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):  # type: ignore[no-untyped-def]
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):  # type: ignore[no-untyped-def]
            steps.append(time.perf_counter() - self.t0)

    cls = SharedPrefixSFTTrainer if share else SFTTrainer
    trainer = cls(
        model=str(model),
        args=config,
        train_dataset=Dataset.from_list(data * args.steps),
        processing_class=AutoTokenizer.from_pretrained(model),
        peft_config=config.lora_config(),
        callbacks=[Clock()],
    )
    trainer.train()
    if share:
        assert trainer.shared_prefix_calls == args.steps * accumulation and not trainer.fallback_calls
    return steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--steps", type=int, default=3, help="optimizer steps per (layout, mode); the first is warm-up"
    )
    p.add_argument(
        "--layouts", default="2x4,8x1", help="rows per micro-batch x accumulation steps, comma-separated"
    )
    p.add_argument("--examples", type=int, default=8)
    p.add_argument("--head", type=int, default=490, help="common head tokens")
    p.add_argument("--tail", type=int, default=25, help="distinct prompt tail tokens per example")
    p.add_argument(
        "--part", type=int, default=30, help="tokens of each completion part (call, tool answer, reply)"
    )
    p.add_argument(
        "--modes", default="shared,per-row", help="which passes, in order (the first's peak RSS is its own)"
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", type=Path, default=Path("runs/bench-replay-sft"))
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    model = prepare_default_model()
    data = make_examples(AutoTokenizer.from_pretrained(model), args)
    tokens = len(data[0]["input_ids"])
    print(
        f"{args.examples} examples x {tokens} tokens ({args.head} head + {args.tail} tail + 3 x {args.part} "
        f"completion, {args.part} of them a masked tool answer); torch threads {torch.get_num_threads()}"
    )
    for layout in args.layouts.split(","):
        timed = {}
        for share in [m == "shared" for m in args.modes.split(",")]:
            steps = run(model, data, layout, share, args)
            timed[share] = statistics.median(steps[1:] or steps)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            print(
                f"layout {layout} {'shared head' if share else 'TRL per-row'}: {timed[share]:.2f} s/step "
                f"(steps {', '.join(f'{s:.1f}' for s in steps)}; peak RSS of the process so far {rss:.1f} GiB)"
            )
        if len(timed) == 2:
            print(f"layout {layout}: shared / per-row = {timed[True] / timed[False]:.2f}")


if __name__ == "__main__":
    main()
