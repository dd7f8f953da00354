"""A whole self-improving stack in one process, for the kill -9 / resume test.

    python tests/support/trainer_process.py OUT_DIR MAX_STEPS

Embedded policy server + gateway + runner threads + lightning trainer (checkpoint every step, hot-swap
every step) on a SQLite store in OUT_DIR; always starts with ``resume_from_checkpoint=True``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentforge.config import default_model_dir
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.runtime import Runner
from agentforge.serving.embedded import EmbeddedServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.publisher import HotSwapPublisher
from agentforge.stores.sql import SQLStore
from agentforge.trainers.grpo_config import TrainConfig
from agentforge.trainers.grpo_trainer import LightningTrainer
from agentforge.types import Task


def letter_agent(task, ctx):
    out = ctx.openai_client().chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": f"Say a word that starts with {task.input['letter']}."}],
        max_tokens=4,
        temperature=1.0,
    )
    return (
        1.0
        if (out.choices[0].message.content or "").strip().lower().startswith(task.input["letter"])
        else 0.0
    )


def main(out: Path, max_steps: int) -> None:
    store = SQLStore(f"sqlite:///{out / 'traces.db'}")
    server = EmbeddedServer(default_model_dir(), max_lora_rank=16)
    server.start()
    router = ModelRouter()
    swapper = HotSwapper(server, router, alias="policy")
    gateway = GatewayServer(store, router).start()
    runner = Runner(store, letter_agent, gateway.url, workers=2, mode="thread").start()
    tasks = [Task(task_id=f"letter-{c}", input={"letter": c}) for c in "abst"]
    config = TrainConfig(
        output_dir=str(out / "run"), num_generations=4, tasks_per_step=1, max_steps=max_steps, swap_every=1,
        learning_rate=5e-4, lora_r=8, logging_steps=1, save_strategy="steps", save_steps=1, report_to="none",
        use_cpu=True, bf16=False, gradient_checkpointing=False, seed=0, max_completion_length=8,
        rollout_timeout_s=120, wait_timeout_s=300,
    )  # fmt: skip
    trainer = LightningTrainer(default_model_dir(), store, tasks, config, HotSwapPublisher(swapper, store))
    print(f"run {trainer.run_id}", flush=True)
    result = trainer.train(resume_from_checkpoint=True)
    print(f"done steps={result['steps']} versions={result['versions']}", flush=True)
    runner.stop()
    gateway.stop()
    server.stop()
    store.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
