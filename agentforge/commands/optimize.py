"""``agentforge optimize-prompt``: GEPA over real rollouts; the winner goes live as a new prompt version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from agentforge.commands.common import console, open_store_url, reported, user_code_importable

__all__ = ["optimize_prompt_cmd"]


def optimize_prompt_cmd(
    agent: Annotated[
        str,
        typer.Argument(help="The agent (module:function); it must read its prompt with ctx.prompt(NAME)."),
    ],
    name: Annotated[str, typer.Option(help="The prompt resource to optimise, e.g. prompt:triage.")],
    tasks: Annotated[Path, typer.Option(help="JSONL tasks for reflection minibatches.")],
    val_tasks: Annotated[Path, typer.Option(help="JSONL tasks GEPA selects candidates on.")],
    test_tasks: Annotated[
        Path | None,
        typer.Option(
            help="JSONL held-out tasks: the winner goes live only if it beats the seed here (without them "
            "nothing goes live: the validation scores that chose the winner cannot also judge it)."
        ),
    ] = None,
    seed_prompt: Annotated[
        str | None, typer.Option(help="Starting template (default: the prompt's active version).")
    ] = None,
    budget: Annotated[int, typer.Option(help="Optimisation budget, rollouts.")] = 600,
    minibatch: Annotated[int, typer.Option(help="Reflection minibatch size, tasks.")] = 6,
    min_gain: Annotated[
        float, typer.Option(help="Required gain of the winner over the seed (mean reward).")
    ] = 0.0,
    max_p: Annotated[
        float | None,
        typer.Option(
            help="Activate only if a one-sided paired test (winner vs seed, same tasks) gives p <= this."
        ),
    ] = 0.05,
    reflection_temperature: Annotated[
        float, typer.Option(help="Sampling temperature of the reflection LM (0 suits small local models).")
    ] = 0.0,
    label_key: Annotated[
        str, typer.Option(help="Task metadata key of the gold label, quoted in the reflection feedback.")
    ] = "label",
    reflection_base_url: Annotated[
        str | None,
        typer.Option(help="OpenAI-compatible /v1 URL of the reflection LM (default: the local policy)."),
    ] = None,
    reflection_model: Annotated[str, typer.Option(help="Reflection model name.")] = "policy",
    reflection_api_key: Annotated[
        str | None,
        typer.Option(envvar="AGENTFORGE_REFLECTION_API_KEY", help="Key of the reflection endpoint."),
    ] = None,
    store_url: Annotated[
        str | None, typer.Option(help="Trace store URL (default: $AGENTFORGE_HOME's SQLite).")
    ] = None,
    model: Annotated[
        Path | None, typer.Option(help="Base checkpoint (default: the prepared SmolLM2-135M).")
    ] = None,
    backend: Annotated[str, typer.Option(help="Policy engine: vllm or embedded.")] = "vllm",
    workers: Annotated[int, typer.Option(help="Runner threads.")] = 4,
    seed: Annotated[int, typer.Option(help="GEPA's random seed.")] = 0,
) -> None:
    """Improve a prompt with GEPA (Agrawal et al. 2025): each candidate is an unactivated prompt version scored
    by real rollouts; the winner is activated (live for the next rollouts, no restart) only if it is better.

    Example: `agentforge optimize-prompt my_pkg.agents:triage --name prompt:triage --tasks train.jsonl
    --val-tasks val.jsonl --test-tasks test.jsonl --seed-prompt "Reply." --budget 300`.
    """
    from agentforge.prompts import get_prompt
    from agentforge.runtime import build_agent, load_tasks
    from agentforge.stack import LocalStack
    from agentforge.trainers.prompt_opt import ReflectionLM, label_feedback, optimize_prompt

    user_code_importable()
    with reported():
        build_agent(agent)  # a wrong spec fails now, not after the engine started
        train, val = load_tasks(tasks), load_tasks(val_tasks)
        test = load_tasks(test_tasks) if test_tasks is not None else None
        labels = sorted({str(t.metadata[label_key]) for t in [*train, *val] if label_key in t.metadata})
        store = open_store_url(store_url)
        seed_text = seed_prompt if seed_prompt is not None else get_prompt(store, name).payload["template"]
        with LocalStack(store, agent, model=model, workers=workers, backend=backend) as stack:
            assert stack.gateway is not None  # started by the with statement
            reflection = ReflectionLM(
                base_url=reflection_base_url or f"{stack.gateway.url}/v1",
                model=reflection_model,
                api_key=reflection_api_key,
                temperature=reflection_temperature,
            )
            result = optimize_prompt(
                store,
                name,
                seed_text,
                train,
                val,
                reflection=reflection,
                max_rollouts=budget,
                testset=test,
                feedback=label_feedback(labels or None, label_key),
                minibatch_size=minibatch,
                seed=seed,
                check=stack.runner.check_workers if stack.runner else None,
                min_gain=min_gain,
                max_p=max_p,
                show_progress=console.is_terminal,
            )
    console.print(result.table())
    active = get_prompt(store, name)
    typer.echo(
        json.dumps(
            {
                "name": name,
                "seed_version": result.seed_version,
                "activated_version": result.activated_version,
                "active_version": active.version,
                "rollouts_used": result.rollouts_used,
                "candidates": len(result.candidates),
            }
        )
    )
