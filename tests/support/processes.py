"""Child processes seen from a test or a benchmark (psutil)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil

__all__ = ["cmdline", "run_script"]


def cmdline(process: psutil.Process) -> list[str]:
    """A process's command line, empty for one that has exited (a zombie until its parent reaps it)."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def run_script(script: Path, *args: str, cwd: Path, timeout: float = 600) -> str:
    """Run a Python script as a user would (this interpreter) and return its stdout.

    The child runs with ``-X faulthandler``, so a crash (a signal such as SIGABRT or SIGSEGV) leaves every
    thread's Python stack on its stderr.

    Raises:
        AssertionError: the script exited non-zero or died of a signal; the message carries the exit status and
            the last 6,000 characters of its stderr.
        subprocess.TimeoutExpired: it ran past ``timeout`` seconds (it is killed).
    """
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )
    assert done.returncode == 0, (
        f"{script.name} exited {done.returncode}; its stderr ends:\n{done.stderr[-6000:]}"
    )
    return done.stdout
