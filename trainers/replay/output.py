"""Writing replay outputs all or nothing (temporary path renamed at the end), with their report and an
optional progress bar. Shared by the JSONL and Hugging Face exports.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from agentforge.errors import UserError

__all__ = ["ExportReport", "atomic_path", "progress_bar"]


@dataclass
class ExportReport:
    """What an export wrote.

    Attributes:
        path: the file (or directory, for :func:`~agentforge.trainers.replay.hf.export_hf`) written.
        records: rollouts written.
        rows: rows written (JSONL: one per rollout; HF: one per trajectory).
        considered: rollouts the selection examined.
        skipped: count per skip reason of the selection.
        bytes: size of the file written (JSONL only).
    """

    path: Path
    records: int
    rows: int
    considered: int
    skipped: Counter[str] = field(default_factory=Counter)
    bytes: int = 0


@contextmanager
def progress_bar(
    total: int | None, description: str, enabled: bool | None
) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr, only when ``enabled`` (``None``: when stderr is a TTY)."""
    if not (sys.stderr.isatty() if enabled is None else enabled):
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


@contextmanager
def atomic_path(path: Path, *, directory: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary file (or empty directory) next to ``path``; when the block succeeds
    rename it onto ``path``, else remove it, so ``path`` is left absent or unchanged.

    Args:
        path: the final file or directory (an existing one is replaced at the end).
        directory: make a temporary directory instead of a file.

    Raises:
        UserError: the parent directory does not exist.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise UserError(f"cannot write {path}: directory {path.parent} does not exist; create it first")
    prefix, suffix = f".{path.name}.", ".tmp"
    if directory:
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=prefix, suffix=suffix))
    else:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
        os.close(fd)
        tmp = Path(name)
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.is_file() else 0o644)
    try:
        yield tmp
        _replace(tmp, path)
    finally:
        _remove(tmp)


def _replace(tmp: Path, path: Path) -> None:
    if tmp.is_dir() and path.is_dir():  # a directory cannot be renamed onto a non-empty one
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        path.rename(old)
        tmp.rename(path)
        _remove(old)
    else:
        os.replace(tmp, path)


def _remove(p: Path) -> None:
    if not p.exists():
        return
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)
