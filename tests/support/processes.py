"""Child processes seen from a test or a benchmark (psutil)."""

from __future__ import annotations

import psutil

__all__ = ["cmdline"]


def cmdline(process: psutil.Process) -> list[str]:
    """A process's command line, empty for one that has exited (a zombie until its parent reaps it)."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []
