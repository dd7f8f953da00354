"""``agentforge replay``: training sets from stored traces — export/import, SFT and offline GRPO jobs."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from agentforge.commands.common import ReportTo, console, fail, parse_pins, report_to_names, reported
from agentforge.types import RolloutState

__all__ = ["replay_app", "make_filter"]


replay_app = typer.Typer(
    help="Train on traces already in the store: select with filters, export/import, SFT, offline GRPO.",
    no_args_is_help=True,
)

StoreUrl = Annotated[
    str | None,
    typer.Option(help="Trace store URL (default: $AGENTFORGE_STORE_URL or SQLite in $AGENTFORGE_HOME)."),
]
StoreKey = Annotated[
    str | None,
    typer.Option(
        envvar="AGENTFORGE_API_KEY",
        help="Bearer key of an http(s) store (set $AGENTFORGE_API_KEY rather than the flag).",
    ),
]
AdminKey = Annotated[
    str | None,
    typer.Option(
        envvar="AGENTFORGE_ADMIN_KEY",
        help="Admin key of an http(s) store: logs exports (privacy:exports, which forget lists) and publishes versions.",
    ),
]
MinReward = Annotated[float | None, typer.Option(help="Keep rollouts whose final reward is >= this.")]
MaxReward = Annotated[float | None, typer.Option(help="Keep rollouts whose final reward is <= this.")]
Since = Annotated[
    str | None, typer.Option(help="Created at or after (epoch seconds or ISO time, e.g. 2026-11-30T08:00).")
]
Until = Annotated[str | None, typer.Option(help="Created before (epoch seconds or ISO time).")]
Agent = Annotated[str | None, typer.Option(help="Only rollouts of this agent name.")]
TaskIds = Annotated[list[str] | None, typer.Option("--task", help="Only this task id (repeat).")]
Pins = Annotated[
    list[str] | None,
    typer.Option(
        "--resource",
        help="Only rollouts that used NAME=VERSION, e.g. policy=policy@v3 or prompt:triage=2 (repeat).",
    ),
]
Limit = Annotated[int | None, typer.Option(help="At most this many rollouts (oldest first).")]


def _time(value: str | None, option: str) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise typer.BadParameter(f"{value!r} is not a time", param_hint=option)
        return seconds
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is neither epoch seconds nor an ISO time", param_hint=option
        ) from None


def make_filter(
    min_reward: float | None = None,
    max_reward: float | None = None,
    since: str | None = None,
    until: str | None = None,
    agent: str | None = None,
    task: list[str] | None = None,
    resource: list[str] | None = None,
    limit: int | None = None,
    **extra: Any,
) -> Any:
    """The :class:`~agentforge.trainers.replay.TraceFilter` the command-line options describe."""
    from agentforge.errors import UserError
    from agentforge.trainers.replay import TraceFilter

    try:
        return TraceFilter(
            min_reward=min_reward,
            max_reward=max_reward,
            since=_time(since, "--since"),
            until=_time(until, "--until"),
            agent=agent,
            task_ids=tuple(task) if task else None,
            resources=parse_pins(resource, "--resource"),
            limit=limit,
            **extra,
        )
    except UserError as exc:
        raise typer.BadParameter(str(exc)) from None


def _store(url: str | None, keys: tuple[str | None, str | None], must_exist: bool = True) -> Any:
    from agentforge.commands.common import open_store_url

    return open_store_url(url, must_exist=must_exist, api_key=keys[0], admin_key=keys[1])


@replay_app.command("export")
def export(
    out: Annotated[Path, typer.Argument(help="Output: a .jsonl file, or a directory with --format hf.")],
    store_url: StoreUrl = None,
    store_key: StoreKey = None,
    admin_key: AdminKey = None,
    format: Annotated[
        str,
        typer.Option(
            help="jsonl (every field, re-importable) or hf (datasets.save_to_disk, one row per trajectory)."
        ),
    ] = "jsonl",
    min_reward: MinReward = None,
    max_reward: MaxReward = None,
    since: Since = None,
    until: Until = None,
    agent: Agent = None,
    task: TaskIds = None,
    resource: Pins = None,
    limit: Limit = None,
    archive: Annotated[
        bool,
        typer.Option(
            help="Every rollout the other filters select, in any state, with or without a reward or token ids."
        ),
    ] = False,
) -> None:
    """Export the selected traces (token ids, logprobs, rewards, versions) atomically.

    Example: `agentforge replay export good.jsonl --min-reward 1 --agent triage`.
    """
    if format not in ("jsonl", "hf"):
        raise typer.BadParameter("choose jsonl or hf", param_hint="--format")
    extra = (
        {"states": tuple(RolloutState), "require_reward": False, "require_tokens": False} if archive else {}
    )
    flt = make_filter(min_reward, max_reward, since, until, agent, task, resource, limit, **extra)
    with reported():
        store = _store(store_url, (store_key, admin_key))
        if format == "jsonl":
            from agentforge.trainers.replay import export_jsonl

            report = export_jsonl(store, out, flt)
        else:
            from agentforge.trainers.replay import export_hf

            report = export_hf(store, out, flt)
    console.print(
        f"wrote {report.records} rollouts ({report.rows} rows) to {report.path}; "
        f"considered {report.considered}, skipped {dict(report.skipped)}"
    )
    typer.echo(
        json.dumps(
            {
                "path": str(report.path),
                "records": report.records,
                "rows": report.rows,
                "considered": report.considered,
                "skipped": dict(report.skipped),
            }
        )
    )


@replay_app.command("import")
def import_(
    path: Annotated[Path, typer.Argument(help="A JSONL file written by `agentforge replay export`.")],
    store_url: StoreUrl = None,
    store_key: StoreKey = None,
    admin_key: AdminKey = None,
    strict: Annotated[
        bool, typer.Option(help="Refuse the whole file (write nothing) if any line is bad.")
    ] = False,
    vocab_size: Annotated[
        int | None,
        typer.Option(help="Token ids must be below this (default: vocab_size of the --model checkpoint)."),
    ] = None,
    model: Model = None,
) -> None:
    """Import traces from JSONL, keeping every id, token id, logprob, reward and version; bad lines are counted
    and skipped (or, with --strict, nothing is written). Importing twice stores nothing twice. The file is not
    trusted: only finished rollouts are imported (runners never pick one up), token ids must lie in the model's
    vocabulary, rewards must be finite and at most 1e6 in size, and a line nested too deeply is one bad line.

    Example: `agentforge replay import good.jsonl --store-url sqlite:///other.db`.
    """
    from agentforge.trainers.replay import import_jsonl

    with reported():
        report = import_jsonl(
            _store(store_url, (store_key, admin_key), must_exist=False),
            path,
            on_error="raise" if strict else "skip",
            vocab_size=vocab_size if vocab_size is not None else _vocab_size(model),
        )
    if report.lines == 0 or (report.imported + report.already_present == 0 and report.skipped):
        what = "is empty" if report.lines == 0 else f"holds no valid trace line ({dict(report.skip_counts)})"
        for problem in report.skipped[:5]:
            console.print(f"  line {problem.line}: {problem.reason} ({problem.detail[:120]})", soft_wrap=True)
        raise fail(f"{path} {what}; expected JSON Lines written by `agentforge replay export`")
    for problem in [*report.skipped, *report.failed][:20]:
        console.print(f"  line {problem.line}: {problem.reason} ({problem.detail[:120]})", soft_wrap=True)
    console.print(
        f"imported {report.imported}, already present {report.already_present}, "
        f"skipped {dict(report.skip_counts)} of {report.lines} lines"
    )
    typer.echo(
        json.dumps(
            {
                "lines": report.lines,
                "imported": report.imported,
                "already_present": report.already_present,
                "skipped": dict(report.skip_counts),
            }
        )
    )
    if report.failed:
        raise typer.Exit(1)


OutputDir = Annotated[Path, typer.Option(help="Checkpoints and the saved adapter.")]
Model = Annotated[Path | None, typer.Option(help="Base checkpoint (default: the prepared SmolLM2-135M).")]
Publish = Annotated[
    bool,
    typer.Option(
        help="Publish the adapter as the store's new active policy version (every `agentforge serve --follow` hot-swaps it)."
    ),
]


def _vocab_size(model: Path | None) -> int:
    """``vocab_size`` from the ``config.json`` of ``model`` (default: the prepared default model)."""
    from agentforge.config import default_model_dir

    config = (model or default_model_dir()) / "config.json"
    try:
        size = json.loads(config.read_text())["vocab_size"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise fail(
            f"cannot read vocab_size from {config} ({type(exc).__name__}: {exc}); pass --vocab-size N or "
            "--model DIR (a checkpoint with config.json), or run `agentforge model prepare`"
        ) from None
    if not isinstance(size, int) or size < 1:
        raise fail(f"{config} holds vocab_size={size!r}; pass --vocab-size N")
    return size


def _publisher(store: Any, publish: bool) -> Any:
    from agentforge.trainers.publish import StorePublisher

    return StorePublisher(store) if publish else None


def _device_args(report_to: str = "none") -> dict[str, Any]:
    import torch

    return {
        "use_cpu": not torch.cuda.is_available(),
        "bf16": True,
        "report_to": report_to_names(report_to, check=False) or "none",
    }


@replay_app.command("sft")
def sft(
    store_url: StoreUrl = None,
    store_key: StoreKey = None,
    admin_key: AdminKey = None,
    output_dir: OutputDir = Path("runs/replay-sft"),
    model: Model = None,
    min_reward: Annotated[float, typer.Option(help="Train on rollouts whose final reward is >= this.")] = 1.0,
    since: Since = None,
    until: Until = None,
    agent: Agent = None,
    task: TaskIds = None,
    resource: Pins = None,
    limit: Limit = None,
    epochs: Annotated[float, typer.Option(help="Passes over the selected trajectories.")] = 2.0,
    learning_rate: Annotated[float, typer.Option(help="AdamW learning rate.")] = 2e-4,
    batch_size: Annotated[int, typer.Option(help="Sequences per optimizer step.")] = 16,
    lora_r: Annotated[int, typer.Option(help="LoRA rank.")] = 16,
    publish: Publish = True,
    report_to: ReportTo = "none",
) -> None:
    """Rejection-sampling fine-tuning: LoRA SFT (TRL SFTTrainer) on the token-exact trajectories of rollouts
    that scored well, loss only on the tokens the policy sampled; then publish the adapter.

    Example: `agentforge replay sft --agent triage --min-reward 1 --epochs 2`.
    """
    from agentforge.model import prepare_default_model
    from agentforge.trainers.replay import select_traces

    flt = make_filter(min_reward, None, since, until, agent, task, resource, limit)
    with reported():
        report_to_names(report_to)  # an unknown or uninstalled integration fails before any work
        store = _store(store_url, (store_key, admin_key))
        select_traces(store, flt)  # EmptySelectionError now, before torch, TRL or the model load (4 s)
        from agentforge.trainers.replay.sft_config import ReplaySFTConfig
        from agentforge.trainers.replay.sft_trainer import run_replay_sft

        config = ReplaySFTConfig(
            output_dir=str(output_dir),
            min_reward=min_reward,
            num_train_epochs=epochs,
            learning_rate=learning_rate,
            per_device_train_batch_size=batch_size,
            lora_r=lora_r,
            lora_alpha=2 * lora_r,
            logging_steps=1,
            save_strategy="no",
            **_device_args(report_to),
        )
        result = run_replay_sft(
            model or prepare_default_model(), store, flt, config, _publisher(store, publish)
        )
    console.print(
        f"trained on {result.examples} trajectories ({result.sampled_tokens} sampled tokens) from "
        f"{result.selected} of {result.considered} rollouts; loss {result.final_loss}; "
        f"adapter {result.adapter_dir}; version {result.version}"
    )
    typer.echo(json.dumps(result.summary(), default=str))


@replay_app.command("grpo")
def grpo(
    store_url: StoreUrl = None,
    store_key: StoreKey = None,
    admin_key: AdminKey = None,
    output_dir: OutputDir = Path("runs/replay-grpo"),
    model: Model = None,
    group_size: Annotated[
        int, typer.Option(help="Rollouts per stored group (G); larger groups are trimmed.")
    ] = 8,
    groups_per_step: Annotated[int, typer.Option(help="Groups per optimizer step.")] = 4,
    epochs: Annotated[float, typer.Option(help="Passes over the stored groups.")] = 1.0,
    learning_rate: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-4,
    lora_r: Annotated[int, typer.Option(help="LoRA rank.")] = 16,
    min_reward: MinReward = None,
    max_reward: MaxReward = None,
    since: Since = None,
    until: Until = None,
    agent: Agent = None,
    task: TaskIds = None,
    resource: Pins = None,
    limit: Limit = None,
    report_to: ReportTo = "none",
) -> None:
    """Offline GRPO on groups already in the store (no new rollouts): group-relative advantages from the stored
    rewards, TRL's importance-sampling correction from the engine's stored logprobs; then publish the adapter.

    Example: `agentforge replay grpo --agent triage --group-size 8 --since 2026-11-30T00:00`.
    """
    from agentforge.model import prepare_default_model
    from agentforge.trainers.replay import select_traces

    flt = make_filter(min_reward, max_reward, since, until, agent, task, resource, limit)
    with reported():
        report_to_names(report_to)  # an unknown or uninstalled integration fails before any work
        store = _store(store_url, (store_key, admin_key))
        select_traces(
            store,
            make_filter(
                min_reward, max_reward, since, until, agent, task, resource, limit, require_reward=False
            ),
        )
        from agentforge.trainers.grpo_config import TrainConfig
        from agentforge.trainers.replay import run_offline_grpo

        config = TrainConfig(
            output_dir=str(output_dir),
            num_generations=group_size,
            tasks_per_step=groups_per_step,
            num_train_epochs=epochs,
            learning_rate=learning_rate,
            lora_r=lora_r,
            lora_alpha=2 * lora_r,
            logging_steps=1,
            save_strategy="no",
            gradient_checkpointing=False,
            **_device_args(report_to),
        )
        result = run_offline_grpo(
            model or prepare_default_model(), store, flt, config, _publisher(store, True)
        )
    summary = {k: v for k, v in result.items() if k not in ("history", "used")}
    console.print(
        f"offline GRPO: {result['steps']} steps on {result['groups']} groups; versions {result['versions']}"
    )
    typer.echo(json.dumps(summary, default=str))
