"""Pieces the CLI sub-commands share: error reporting, ``key=value`` pins, progress bars."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console

__all__ = ["console", "fail", "parse_pins", "reported"]

#: Everything human-facing goes to stderr; stdout carries only machine-readable results.
console = Console(stderr=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` in red and return the ``typer.Exit`` to raise (exit status ``code``)."""
    from rich.markup import escape

    console.print(f"[red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)
    return typer.Exit(code)


@contextmanager
def reported() -> Iterator[None]:
    """Turn agentforge's errors into one red line and exit status 2 (misuse) or 1 (run failure)."""
    from agentforge.errors import AgentForgeError, UserError

    try:
        yield
    except UserError as exc:
        raise fail(str(exc), 2) from exc
    except AgentForgeError as exc:
        raise fail(str(exc), 1) from exc


def parse_pins(pins: Sequence[str] | None) -> dict[str, str]:
    """``["policy=policy@v3", "prompt:triage=2"]`` → ``{"policy": "policy@v3", "prompt:triage": "2"}``.

    Raises:
        typer.BadParameter: an entry without ``=`` or with an empty side.
    """
    out: dict[str, str] = {}
    for pin in pins or ():
        name, sep, value = pin.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise typer.BadParameter(
                f"{pin!r} is not NAME=VERSION (e.g. policy=policy@v3)", param_hint="--pin"
            )
        out[name.strip()] = value.strip()
    return out


def progress() -> Any:
    """A rich progress bar on stderr (bar, count, elapsed); disabled when stderr is not a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
    )
