"""``agentforge train``: GRPO + LoRA on an agent's own rollouts, hot-swapping each adapter into serving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from agentforge.commands.common import (
    ChatTemplate,
    KeptVersions,
    MaxCpuLoras,
    MaxLoras,
    MaxModelLen,
    ReportTo,
    console,
    open_store_url,
    print_engine,
    report_to_names,
    reported,
    user_code_importable,
)

__all__ = ["train"]


def train(
    agent: Annotated[
        str, typer.Argument(help="The agent as module:function; its return value is the reward.")
    ],
    tasks: Annotated[Path, typer.Option(help='JSONL training tasks ({"input": {...}} per line).')],
    eval_tasks: Annotated[
        Path | None, typer.Option(help="JSONL held-out tasks: mean reward before and after training.")
    ] = None,
    output_dir: Annotated[Path, typer.Option(help="Checkpoints, adapters, metrics.jsonl.")] = Path(
        "runs/train"
    ),
    store_url: Annotated[
        str | None, typer.Option(help="Trace store URL (default: SQLite in --output-dir).")
    ] = None,
    model: Annotated[
        Path | None, typer.Option(help="Base checkpoint (default: the prepared SmolLM2-135M).")
    ] = None,
    backend: Annotated[str, typer.Option(help="Policy engine: vllm or embedded.")] = "vllm",
    steps: Annotated[int, typer.Option(help="GRPO optimizer steps.")] = 20,
    group_size: Annotated[int, typer.Option(help="Rollouts per task (G).")] = 8,
    tasks_per_step: Annotated[int, typer.Option(help="Tasks per step.")] = 4,
    swap_every: Annotated[int, typer.Option(help="Publish + hot-swap the adapter every k steps.")] = 5,
    learning_rate: Annotated[float, typer.Option(help="AdamW learning rate.")] = 3e-4,
    lora_r: Annotated[int, typer.Option(help="LoRA rank.")] = 16,
    max_completion_length: Annotated[
        int,
        typer.Option(
            help="TRL's completion length |o_i|, tokens: with agentforge's rollouts it counts every token after "
            "the first prompt (sampled tokens plus the tool outputs and user turns between calls), truncates "
            "nothing and caps no sampling (cap that with max_tokens in the agent's requests); only "
            "loss_type dr_grpo uses it, as its length normaliser. `agentforge traces show` counts the "
            "sampled (mask 1) and other tokens of each trajectory.",
        ),
    ] = 256,
    max_model_len: MaxModelLen = 2048,
    chat_template: ChatTemplate = None,
    max_staleness: KeptVersions = 1,
    max_loras: MaxLoras = 4,
    max_cpu_loras: MaxCpuLoras = None,
    workers: Annotated[int, typer.Option(help="Runner threads executing rollouts.")] = 8,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    report_to: ReportTo = "none",
    resume: Annotated[bool, typer.Option(help="Continue from the last checkpoint in --output-dir.")] = True,
    gate_max_p: Annotated[
        float | None,
        typer.Option(
            help="Promote each new adapter only through the eval gate: on --eval-tasks, a paired sign test "
            "against the live version must give p <= this (and the gain exceed --gate-min-gain); refused "
            "versions are never served by default. Decisions: `agentforge versions policy`."
        ),
    ] = None,
    gate_min_gain: Annotated[
        float, typer.Option(help="The eval gate's minimum mean-reward gain over the live version.")
    ] = 0.0,
    rollout_timeout: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds one attempt of a rollout may take (every model call, tool and customer turn); a "
            "slower attempt is timed out and retried, and its late calls are stored as late spans, never "
            "trained on. Raise it for long conversations or a busy machine.",
        ),
    ] = 300.0,
    agent_name: Annotated[
        str | None,
        typer.Option(
            help="Agent name stored on the rollouts (`agentforge traces list --agent`; default: AGENT)."
        ),
    ] = None,
    max_rows_per_micro_batch: Annotated[
        int,
        typer.Option(
            min=0,
            help="Most rollouts in one forward/backward: a step's --tasks-per-step x --group-size rollouts are "
            "split into equal micro-batches of at most this many (the update is the same). The update's memory "
            "grows with this x the rollouts' length (prompt + completion tokens), not with rollouts per step: "
            "4.8 GB at 8 and 5.5 GB at 32 rollouts a step of 1,400 tokens on the default model (6.1 GB "
            "and an estimated 22 GB before). Lower it if training runs out of memory; "
            "0 puts every rollout of a step in one micro-batch.",
        ),
    ] = 8,
    trajectories_per_rollout: Annotated[
        int,
        typer.Option(
            min=1,
            help="Training rows per rollout, for agents whose rollout holds several conversations at once (the "
            "parallel branches of a LangGraph graph, each its own chat): each of its last N trajectories trains "
            "with the rollout's reward. --group-size then counts rows: a group is group-size / N rollouts.",
        ),
    ] = 1,
    negative_advantage_scale: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Multiply every negative advantage by this: 1 is GRPO as published, 0 pushes only the rollouts "
            "better than their group's mean (RAFT-like); in between, worse rollouts are pushed down less.",
        ),
    ] = 1.0,
    part_credit: Annotated[
        bool,
        typer.Option(
            help="Credit by reward part: the tokens of a call that made tool calls get the advantage of the "
            "reward's tool and arguments parts, a later reply's tokens that of its reply part (the scorer's "
            "metadata['parts']; rollouts without parts train as GRPO).",
        ),
    ] = False,
) -> None:
    """Train AGENT's policy with GRPO on its own rollouts: serve → run G rollouts per task → score → update →
    hot-swap, without touching the agent's code. Prints the engine's own address at start (for a simulated
    customer; agents get it as ctx.engine), one line per step on stderr (reward, s/step, served version; every
    metric goes to --output-dir/metrics.jsonl) and a JSON summary (versions, before/after) on stdout.

    Example: `agentforge train my_pkg.agents:triage --tasks train.jsonl --eval-tasks test.jsonl --steps 20`.
    """
    from agentforge.runtime import build_agent, load_tasks

    user_code_importable()
    with reported():
        build_agent(agent)  # a wrong spec fails now, not after the engine started
        report_to_names(report_to)  # an unknown or uninstalled integration too
        train_tasks = load_tasks(tasks)
        held_out = load_tasks(eval_tasks) if eval_tasks is not None else None
        if gate_max_p is not None and not held_out:
            from agentforge.errors import UserError

            raise UserError(
                "--gate-max-p needs --eval-tasks: the gate compares versions on those held-out tasks"
            )
        gate = None
        if gate_max_p is not None:
            from agentforge.gate import EvalGate

            gate = EvalGate(max_p=gate_max_p, min_gain=gate_min_gain)
        config = _config(
            output_dir,
            steps,
            group_size,
            tasks_per_step,
            swap_every,
            learning_rate,
            lora_r,
            max_completion_length,
            seed,
            report_to,
            max_staleness,
            rollout_timeout_s=rollout_timeout,
            agent_name=agent if agent_name is None else agent_name,
            max_rows_per_micro_batch=max_rows_per_micro_batch,
            trajectories_per_rollout=trajectories_per_rollout,
            negative_advantage_scale=negative_advantage_scale,
            part_credit=part_credit,
        )
        if len(train_tasks) < config.tasks_per_step:
            from agentforge.errors import UserError

            raise UserError(
                f"{tasks} holds {len(train_tasks)} tasks; one step needs --tasks-per-step {config.tasks_per_step}"
            )
        output_dir.mkdir(parents=True, exist_ok=True)
        store = open_store_url(store_url or f"sqlite:///{(output_dir / 'traces.db').resolve()}")
        engine = {
            "max_model_len": max_model_len,
            "chat_template": chat_template,
            "max_loras": max_loras,
            "max_cpu_loras": max_cpu_loras,
            "retain": config.max_staleness,
        }
        console.print(f"starting the {backend} engine with {model or 'the default model'} …")
        summary = _train(
            agent, store, train_tasks, held_out, config, model, backend, workers, resume, gate, engine
        )
    typer.echo(json.dumps(summary))


def _config(
    output_dir,
    steps,
    group_size,
    tasks_per_step,
    swap_every,
    lr,
    lora_r,
    max_len,
    seed,
    report_to="none",
    max_staleness=1,
    rollout_timeout_s=300.0,
    agent_name="",
    **memory,
):
    """The run's :class:`TrainConfig`; ``memory`` takes its further fields (``max_rows_per_micro_batch``,
    ``logprob_chunk_tokens``, ``trajectories_per_rollout``, ``negative_advantage_scale``, ``part_credit``; default:
    TrainConfig's)."""
    import torch

    from agentforge.trainers.grpo_config import TrainConfig

    gpu = torch.cuda.is_available()
    return TrainConfig(
        output_dir=str(output_dir),
        seed=seed,
        data_seed=seed,
        max_steps=steps,
        num_generations=group_size,
        tasks_per_step=tasks_per_step,
        swap_every=swap_every,
        learning_rate=lr,
        lr_scheduler_type="constant",
        lora_r=lora_r,
        lora_alpha=2 * lora_r,
        max_completion_length=max_len,
        logging_steps=1,
        save_strategy="steps",
        save_steps=swap_every,
        save_total_limit=1,
        report_to=report_to_names(report_to, check=False) or "none",
        use_cpu=not gpu,
        bf16=True,
        gradient_checkpointing=False,
        max_staleness=max_staleness,
        rollout_timeout_s=rollout_timeout_s,
        agent_name=agent_name,
        **memory,
    )


def _train(
    agent,
    store,
    train_tasks,
    held_out,
    config,
    model,
    backend,
    workers,
    resume,
    gate=None,
    engine=None,
):
    from agentforge.model import prepare_default_model
    from agentforge.runtime import evaluate_tasks, task_scores
    from agentforge.serving.promoter import GatedPublisher
    from agentforge.serving.publisher import HotSwapPublisher
    from agentforge.stack import LocalStack
    from agentforge.trainers.grpo_trainer import LightningTrainer

    model = model or prepare_default_model()
    summary: dict[str, object] = {}
    with LocalStack(
        store,
        agent,
        model=model,
        workers=workers,
        backend=backend,
        max_lora_rank=max(16, config.lora_r),
        **(engine or {}),
    ) as stack:
        swapper, router = stack.swapper, stack.router
        assert swapper is not None and router is not None  # started by the with statement
        print_engine(stack.engine)  # a simulated customer's endpoint; agents also get it as ctx.engine
        if held_out:
            summary["before"] = evaluate_tasks(
                store, held_out, {"policy": stack.base_version}, label="before"
            )
            console.print(f"held-out mean reward of {stack.base_version}: {summary['before']:.4f}")
        publisher: HotSwapPublisher | GatedPublisher = HotSwapPublisher(swapper, store)
        if gate is not None:  # each adapter meets the live version on the held-out tasks first
            publisher = GatedPublisher(
                swapper,
                store,
                gate=gate,
                evaluate=lambda v: task_scores(store, held_out, {config.alias: v}, label="gate"),
            )
        trainer = LightningTrainer(model, store, train_tasks, config, publisher)
        trainer.train(resume_from_checkpoint=resume)
        version = router.alias(config.alias)
        assert version is not None  # the stack registered the base model under the alias
        summary.update(
            version=version,
            versions=trainer.versions,
            steps=trainer.trainer.state.global_step,
            skipped_publishes=trainer.skipped_publishes,
        )
        if isinstance(publisher, GatedPublisher):
            summary["decisions"] = [
                {"stage": d.stage, "outcome": d.outcome, "candidate": d.candidate, "live": d.live}
                for d in publisher.decisions
            ]
        if held_out:
            summary["after"] = evaluate_tasks(store, held_out, {"policy": version}, label="after")
            console.print(f"held-out mean reward of {version}: {summary['after']:.4f}")
    return summary
