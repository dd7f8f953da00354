"""A whole self-improving stack in one process, for the kill -9 / resume tests.

    python tests/support/trainer_process.py OUT_DIR MAX_STEPS [--model DIR] [--kill-at STEP]
        [--adapter-only] [--save-steps N]

Embedded policy server + gateway + runner threads + lightning trainer (seed 0, cosine schedule, hot-swap
every step) on a SQLite store in OUT_DIR; always starts with ``resume_from_checkpoint=True``. ``--model``
serves and trains another checkpoint (the tests pass the tiny model; default: SmolLM2-135M). ``--kill-at S``
sends this process SIGKILL once the batch of step ``S`` (0-based) is formed, before it is trained on.
``--adapter-only`` checkpoints with ``save_only_model=True``. Each process appends JSON lines to
``OUT_DIR/report.jsonl``: ``train_begin`` (the global step and the summed ``|exp_avg|`` of Adam's first
moments just after the checkpoint was loaded) and ``done`` (the train result without its history).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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


def letter_train_config(output_dir: Path | str, **changes) -> TrainConfig:
    """The letter tasks' GRPO config on the default 135M model (G = 4, 2 tasks a step, lr 5e-4, LoRA r 8, float32
    on the CPU, 8-token answers, generous rollout waits) in ``output_dir``; ``changes`` override."""
    fields = dict(
        output_dir=str(output_dir),
        num_generations=4,
        tasks_per_step=2,
        learning_rate=5e-4,
        lora_r=8,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        max_completion_length=8,
        rollout_timeout_s=120,
        wait_timeout_s=300,
    )
    return TrainConfig(**{**fields, **changes})


def letter_agent(task, ctx):
    """Asks for a word starting with ``task.input["letter"]``, in the API ``task.input["dialect"]`` names (chat by
    default; ``responses`` or ``anthropic``: the gateway's other dialects, through their official SDKs)."""
    ask = f"Say a word that starts with {task.input['letter']}."
    dialect, model = task.input.get("dialect", "chat"), task.input.get("model", "policy")
    if dialect == "responses":
        text = (
            ctx.openai_client()
            .responses.create(model=model, input=ask, max_output_tokens=4, temperature=1.0)
            .output_text
        )
    elif dialect == "anthropic":
        import anthropic

        client = anthropic.Anthropic(
            base_url=ctx.base_url.removesuffix("/v1"),
            api_key=ctx.api_key,
            default_headers=ctx.default_headers,
            max_retries=0,
        )
        answer = client.messages.create(
            model=model,
            max_tokens=4,
            messages=[{"role": "user", "content": ask}],
            extra_body={"temperature": 1.0},
        )
        text = "".join(b.text for b in answer.content if b.type == "text")
    else:
        out = ctx.openai_client().chat.completions.create(
            model=model, messages=[{"role": "user", "content": ask}], max_tokens=4, temperature=1.0
        )
        text = out.choices[0].message.content or ""
    text = text.strip().lower()
    if task.input.get("parity"):  # the tiny random model never spells a word: reward the text's length parity
        return float(len(text) % 2)
    return 1.0 if text.startswith(task.input["letter"]) else 0.0


def _report_callback(path: Path, owner):  # noqa: ANN202 - a transformers TrainerCallback
    """A callback that appends the state just after loading (Adam's first moments) to ``path``; made here so
    that importing this module (the tests take ``letter_agent`` and ``letter_train_config`` from it) costs no
    transformers import."""
    from transformers import TrainerCallback

    class _Report(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            optimizer = owner.trainer.optimizer
            moments = [s["exp_avg"] for s in optimizer.state_dict()["state"].values() if "exp_avg" in s]
            row = {"event": "train_begin", "pid": os.getpid(), "global_step": int(state.global_step)}
            row["adam_exp_avg_abs"] = float(sum(m.abs().sum() for m in moments)) if moments else 0.0
            with path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")

    return _Report()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("max_steps", type=int)
    parser.add_argument("--model", default=None)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--adapter-only", action="store_true")
    parser.add_argument("--save-steps", type=int, default=1)
    args = parser.parse_args(argv)
    # The trainer's heavy imports run here, in the main thread, before the engine, gateway and runner threads
    # start: CI once saw ``datasets`` fail to import ("No module named 'datasets.download.
    # streaming_download_manager'") when the trainer was built while those threads were importing, a class of
    # concurrent-import races CPython has fixed piecemeal (python/cpython#143650, #75074).
    import datasets  # noqa: F401
    import trl  # noqa: F401

    out, model = args.out, args.model or str(default_model_dir())
    store = SQLStore(f"sqlite:///{out / 'traces.db'}")
    server = EmbeddedServer(model, max_lora_rank=16)
    server.start()
    router = ModelRouter()
    swapper = HotSwapper(server, router, alias="policy")
    gateway = GatewayServer(store, router).start()
    runner = Runner(store, letter_agent, gateway.url, workers=2, mode="thread").start()
    parity = args.model is not None
    tasks = [Task(task_id=f"letter-{c}", input={"letter": c, "parity": parity}) for c in "abst"]
    config = TrainConfig(
        output_dir=str(out / "run"),
        num_generations=4,
        tasks_per_step=1 if not parity else 2,
        max_steps=args.max_steps,
        swap_every=1,
        learning_rate=5e-4,
        lr_scheduler_type="cosine",
        lora_r=8,
        logging_steps=1,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_only_model=args.adapter_only,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        seed=0,
        max_completion_length=8,
        rollout_timeout_s=120,
        wait_timeout_s=300,
    )
    trainer = LightningTrainer(model, store, tasks, config, HotSwapPublisher(swapper, store))
    trainer.trainer.add_callback(_report_callback(out / "report.jsonl", trainer))
    if args.kill_at is not None:
        samples = trainer.source.samples

        def samples_then_die(rollouts, report, trained=None):
            batch = samples(rollouts, report, trained)
            if trainer.source.step == args.kill_at:  # formed, not yet trained on
                os.kill(os.getpid(), signal.SIGKILL)
            return batch

        trainer.source.samples = samples_then_die
    print(f"run {trainer.run_id}", flush=True)
    result = trainer.train(resume_from_checkpoint=True)
    with (out / "report.jsonl").open("a") as fh:
        row = {"event": "done", "pid": os.getpid(), **{k: v for k, v in result.items() if k != "history"}}
        fh.write(json.dumps(row) + "\n")
    print(f"done steps={result['steps']} versions={result['versions']}", flush=True)
    runner.stop()
    gateway.stop()
    server.stop()
    store.close()


if __name__ == "__main__":
    main(sys.argv[1:])
