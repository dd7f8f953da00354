"""Pieces the CLI sub-commands share: error reporting, ``key=value`` pins, progress bars."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

__all__ = [
    "stop_on_signals",
    "console",
    "fail",
    "parse_pins",
    "reported",
    "open_store_url",
    "user_code_importable",
    "MaxModelLen",
    "ChatTemplate",
    "MaxLoras",
    "MaxCpuLoras",
    "KeptVersions",
    "print_engine",
    "ReportTo",
    "report_to_names",
    "StoreApiKey",
]

#: ``--max-model-len`` of the commands that start an engine (``serve``, ``train``).
MaxModelLen = Annotated[
    int,
    typer.Option(
        min=16,
        help="The engine's context length in tokens (prompt + completion; tool schemas and the system "
        "prompt count).",
    ),
]
#: ``--chat-template`` of the commands that start an engine.
ChatTemplate = Annotated[
    Path | None,
    typer.Option(
        exists=True,
        dir_okay=False,
        help="Jinja chat template that renders the tool schemas and tool-call turns (default: the model's "
        "own if it mentions tools, else agentforge's Hermes-style <tool_call> template for SmolLM2).",
    ),
]

#: ``--max-loras`` of the commands that start an engine (vLLM only).
MaxLoras = Annotated[
    int,
    typer.Option(
        min=2,
        help="vLLM's --max-loras: adapter versions one batch may mix (at least the old and the new one of a "
        "hot swap).",
    ),
]
#: ``--max-cpu-loras`` of the commands that start an engine (vLLM only).
MaxCpuLoras = Annotated[
    int | None,
    typer.Option(
        min=2,
        help="vLLM's --max-cpu-loras: adapter versions kept loaded (default: --max-loras); it must hold the "
        "active version, the earlier ones kept for stale rollouts and the one being swapped in.",
    ),
]
#: ``serve --retain`` and ``train --max-staleness``: one number, the trainer's ``max_staleness``.
KeptVersions = Annotated[
    int,
    typer.Option(
        min=0,
        help="Earlier adapter versions serving keeps loaded behind the active one, so rollouts still pinned "
        "to them finish there: the trainer's max_staleness (it trains on samples at most this many versions "
        "old). vLLM must hold this + 2 versions (--max-cpu-loras, else --max-loras); less is refused at start.",
    ),
]

#: ``--store-api-key`` of the commands that open a store by URL and also take an ``--api-key`` of their own.
StoreApiKey = Annotated[
    str | None,
    typer.Option(
        envvar="AGENTFORGE_STORE_API_KEY",
        help="Bearer key of the store server when --store-url is http(s) (default: --api-key).",
    ),
]

#: ``--report-to`` of the training jobs (``train``, ``replay sft``, ``replay grpo``): TRL's ``report_to``.
ReportTo = Annotated[
    str,
    typer.Option(
        help="Also log each step's metrics to these transformers integrations, comma-separated: tensorboard "
        "(event files in --output-dir/runs; view with `tensorboard --logdir <output-dir>/runs`), wandb (W&B; "
        "`pip install wandb`, then WANDB_API_KEY and WANDB_PROJECT, or WANDB_MODE=offline), mlflow, ...; "
        "none: only --output-dir/metrics.jsonl.",
    ),
]


def report_to_names(value: str, check: bool = True) -> list[str]:
    """The integrations a ``--report-to`` value names (``"none"`` and empty names dropped).

    Args:
        value: comma-separated names, e.g. ``"tensorboard,wandb"``.
        check: also check each name against transformers' integrations and that its package is installed.

    Returns:
        The names, in order (``[]``: none, so only ``metrics.jsonl``).

    Raises:
        UserError: (with ``check``) an unknown name, or one whose package is not installed (the message says
            what to install).
    """
    names = [n.strip() for n in value.split(",") if n.strip() and n.strip() != "none"]
    if check and names:
        from transformers.integrations.integration_utils import (
            INTEGRATION_TO_CALLBACK,
            get_available_reporting_integrations,
        )

        from agentforge.errors import UserError

        unknown = [n for n in names if n not in INTEGRATION_TO_CALLBACK]
        if unknown:
            raise UserError(
                f"--report-to {','.join(unknown)}: not an integration; use none or some of "
                f"{', '.join(sorted(INTEGRATION_TO_CALLBACK))}"
            )
        missing = [n for n in names if n not in get_available_reporting_integrations()]
        if missing:
            raise UserError(
                f"--report-to {','.join(missing)}: not installed here; pip install "
                f"{' '.join('tensorboard' if n == 'tensorboard' else n for n in missing)}"
            )
    return names


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
    except OSError as exc:  # a path that is a directory, not writable, missing…
        raise fail(f"{exc.strerror or type(exc).__name__}: {exc.filename or exc}", 2) from exc


def parse_pins(pins: Sequence[str] | None, option: str = "--pin") -> dict[str, str]:
    """``["policy=policy@v3", "prompt:triage=2"]`` → ``{"policy": "policy@v3", "prompt:triage": "2"}``.

    Versions of ``policy`` and ``prompt:*`` are normalised to the stored spelling (``policy=v3`` →
    ``policy@v3``, ``prompt:triage=v2`` → ``2``).

    Raises:
        typer.BadParameter: an entry without ``=``, with an empty side, or with a version that is no number.
    """
    out: dict[str, str] = {}
    for pin in pins or ():
        name, sep, value = pin.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise typer.BadParameter(
                f"{pin!r} is not NAME=VERSION (e.g. policy=policy@v3)", param_hint=option
            )
        out[name.strip()] = _normalise_version(name.strip(), value.strip(), option)
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


def _normalise_version(name: str, value: str, option: str) -> str:
    """The stored spelling of a version: ``policy=v3`` → ``policy@v3``; ``prompt:x=v2`` / ``prompt:x@v2`` → ``2``."""
    from agentforge.errors import UserError
    from agentforge.types import Version

    if name != "policy" and not name.startswith("prompt"):
        return value  # another resource kind: kept as written
    try:
        version = Version.parse(value, name=name)
    except UserError as exc:
        raise typer.BadParameter(
            f"{name}={value!r}: {exc}; the version must be a number such as 3, v3 or {name}@v3",
            param_hint=option,
        ) from None
    return str(version) if name == "policy" else str(version.number)


def open_store_url(
    url: str | None, *, must_exist: bool = False, api_key: str | None = None, admin_key: str | None = None
) -> Any:
    """:func:`agentforge.open_store` for a command: a SQLite store's folder must exist, even for a new file.

    Args:
        url: ``sqlite:///path``, ``postgresql+psycopg://…`` or ``http(s)://`` (a gateway's store API);
            ``None``: ``$AGENTFORGE_STORE_URL`` or SQLite in ``$AGENTFORGE_HOME``.
        must_exist: refuse a SQLite file that does not exist yet (commands that only read: a typo must not
            create an empty store).

    Raises:
        UserError: the URL cannot be parsed, or the SQLite file (or its folder) does not exist.
    """
    from pathlib import Path

    from agentforge.config import default_store_url
    from agentforge.errors import UserError
    from agentforge.open import HTTP_SCHEMES, open_store

    url = url or default_store_url()
    if not must_exist and not url.startswith(HTTP_SCHEMES):  # with must_exist, open_store checks the file
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            parsed = make_url(url)
        except ArgumentError:
            parsed = None  # open_store's error names the accepted forms
        if (
            parsed is not None
            and parsed.get_backend_name() == "sqlite"
            and parsed.database not in (None, "", ":memory:")
        ):
            folder = Path(parsed.database).expanduser().parent
            if not folder.is_dir():
                raise UserError(f"folder {folder} does not exist (store {url!r})")
    return open_store(url, api_key=api_key, admin_key=admin_key, must_exist=must_exist)


def print_engine(engine: Any) -> None:
    """Print the engine's own address, model and inference key on stderr: the endpoint for a simulated customer.

    Its calls bypass the gateway, so they are neither recorded nor trained on (a customer pointed at the
    gateway would make unattributed calls). The key is new at each engine start; it cannot load adapters.

    Args:
        engine: an :class:`~agentforge.runtime.context.EngineEndpoint`, or a policy server (``base_url``,
            ``auth_headers()``, ``base_model_name``), whose endpoint is printed.
    """
    from agentforge.runtime.context import EngineEndpoint

    if not isinstance(engine, EngineEndpoint):
        from agentforge.stack import engine_endpoint

        engine = engine_endpoint(engine)
    console.print(
        f"[bold]engine[/] {engine.base_url}  model {engine.model}  key {engine.api_key or '(none)'}  "
        "(for a simulated customer: not recorded, never trained on)",
        soft_wrap=True,
    )


def user_code_importable() -> None:
    """Put the current directory first on ``sys.path`` so ``my_agents:triage`` imports from where the user
    runs the command (as ``python -m`` does; a console script would not)."""
    import os
    import sys

    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def stop_on_signals() -> tuple[threading.Event, list[str]]:
    """Make SIGINT (Ctrl-C, ``kill -INT``) and SIGTERM (``kill``, a container stop) a clean stop of a foreground server (``serve``, ``dashboard``)
    (exit status 0) instead of death by signal (143), whatever the parent left them as.

    A shell starts a background job (``agentforge serve &`` in a script) with SIGINT *ignored*, and Python
    keeps an inherited ignore: without its own handler the server would never stop on ``kill -INT``. Like
    uvicorn, the server installs both handlers itself (and unblocks both, in case the parent blocked them).

    Returns:
        ``(event, why)``: either signal sets the event and appends ``"interrupt"`` (SIGINT) or ``"SIGTERM"``
        to ``why``.
    """
    import signal

    stop = threading.Event()
    why: list[str] = []

    def _on_signal(signum: int, frame: object) -> None:
        why.append("interrupt" if signum == signal.SIGINT else signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    return stop, why
