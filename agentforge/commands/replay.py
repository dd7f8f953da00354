"""``agentforge replay``: training sets from stored traces — export/import, SFT and offline GRPO jobs."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from agentforge.commands.common import console, parse_pins, reported

__all__ = ["replay_app", "make_filter"]

replay_app = typer.Typer(
    help="Train on traces already in the store: select with filters, export/import, SFT, offline GRPO.",
    no_args_is_help=True,
)

StoreUrl = Annotated[str | None, typer.Option(help="Trace store URL (default: $AGENTFORGE_STORE_URL or SQLite in $AGENTFORGE_HOME).")]  # fmt: skip
MinReward = Annotated[float | None, typer.Option(help="Keep rollouts whose final reward is >= this.")]
MaxReward = Annotated[float | None, typer.Option(help="Keep rollouts whose final reward is <= this.")]
Since = Annotated[str | None, typer.Option(help="Created at or after (epoch seconds or ISO time, e.g. 2026-11-30T08:00).")]  # fmt: skip
Until = Annotated[str | None, typer.Option(help="Created before (epoch seconds or ISO time).")]
Agent = Annotated[str | None, typer.Option(help="Only rollouts of this agent name.")]
TaskIds = Annotated[list[str] | None, typer.Option("--task", help="Only this task id (repeat).")]
Pins = Annotated[list[str] | None, typer.Option("--resource", help="Only rollouts that used NAME=VERSION, e.g. policy=policy@v3 or prompt:triage=2 (repeat).")]  # fmt: skip
Limit = Annotated[int | None, typer.Option(help="At most this many rollouts (oldest first).")]


def _time(value: str | None, option: str) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
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
    from agentforge.trainers.replay import TraceFilter

    return TraceFilter(
        min_reward=min_reward, max_reward=max_reward, since=_time(since, "--since"), until=_time(until, "--until"),
        agent=agent, task_ids=tuple(task) if task else None, resources=parse_pins(resource), limit=limit, **extra,
    )  # fmt: skip


def _store(url: str | None) -> Any:
    from agentforge.config import default_store_url
    from agentforge.runtime.process import open_store

    return open_store(url or default_store_url())


@replay_app.command("export")
def export(
    out: Annotated[Path, typer.Argument(help="Output: a .jsonl file, or a directory with --format hf.")],
    store_url: StoreUrl = None,
    format: Annotated[
        str,
        typer.Option(
            help="jsonl (every field, re-importable) or hf (datasets.save_to_disk, one row per trajectory)."
        ),
    ] = "jsonl",  # fmt: skip
    min_reward: MinReward = None,
    max_reward: MaxReward = None,
    since: Since = None,
    until: Until = None,
    agent: Agent = None,
    task: TaskIds = None,
    resource: Pins = None,
    limit: Limit = None,
) -> None:
    """Export the selected traces (token ids, logprobs, rewards, versions) atomically.

    Example: `agentforge replay export good.jsonl --min-reward 1 --agent triage`.
    """
    if format not in ("jsonl", "hf"):
        raise typer.BadParameter("choose jsonl or hf", param_hint="--format")
    flt = make_filter(min_reward, max_reward, since, until, agent, task, resource, limit)
    with reported():
        store = _store(store_url)
        if format == "jsonl":
            from agentforge.trainers.replay import export_jsonl

            report = export_jsonl(store, out, flt)
        else:
            from agentforge.trainers.replay import export_hf

            report = export_hf(store, out, flt)
    console.print(f"wrote {report.records} rollouts ({report.rows} rows) to {report.path}; "
                  f"considered {report.considered}, skipped {dict(report.skipped)}")  # fmt: skip
    typer.echo(json.dumps({"path": str(report.path), "records": report.records, "rows": report.rows,
                           "considered": report.considered, "skipped": dict(report.skipped)}))  # fmt: skip


@replay_app.command("import")
def import_(
    path: Annotated[Path, typer.Argument(help="A JSONL file written by `agentforge replay export`.")],
    store_url: StoreUrl = None,
    strict: Annotated[
        bool, typer.Option(help="Refuse the whole file (write nothing) if any line is bad.")
    ] = False,
) -> None:
    """Import traces from JSONL, keeping every id, token id, logprob, reward and version; bad lines are counted
    and skipped (or, with --strict, nothing is written). Importing twice stores nothing twice.

    Example: `agentforge replay import good.jsonl --store-url sqlite:///other.db`.
    """
    from agentforge.trainers.replay import import_jsonl

    with reported():
        report = import_jsonl(_store(store_url), path, on_error="raise" if strict else "skip")
    for problem in [*report.skipped, *report.failed][:20]:
        console.print(f"  line {problem.line}: {problem.reason} ({problem.detail[:120]})", soft_wrap=True)
    console.print(f"imported {report.imported}, already present {report.already_present}, "
                  f"skipped {dict(report.skip_counts)} of {report.lines} lines")  # fmt: skip
    typer.echo(json.dumps({"lines": report.lines, "imported": report.imported,
                           "already_present": report.already_present, "skipped": dict(report.skip_counts)}))  # fmt: skip
    if report.failed:
        raise typer.Exit(1)
