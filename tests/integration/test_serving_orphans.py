"""A process that started vLLM and is then killed (SIGKILL: no atexit) leaves no vLLM process behind.

On the CPU build vLLM runs as two processes, its API server and its engine core with the model inside
(``serving/vllm.py``: no third, worker process); both go.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentforge.config import vllm_python
from agentforge.serving.vllm_files import is_cpu_build

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SCRIPT = """
import sys, time
from agentforge.serving.vllm import VLLMServer
server = VLLMServer(warmup=False, enable_tools=False)
server.start()
print(server._proc.pid, flush=True)
time.sleep(600)
"""


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (vLLM starts in its own session: pgid = its pid)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid and _alive(int(entry)):
                    pids.append(int(entry))
            except (ProcessLookupError, FileNotFoundError):
                continue
    return pids


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode(errors="replace")[:200]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is dead for our purposes
        return fh.read().split()[2] != "Z"


def test_killed_parent_takes_vllm_down() -> None:
    if vllm_python() is None and not os.environ.get("AGENTFORGE_REQUIRE_VLLM"):
        pytest.skip("no vLLM environment (.venv-vllm); run `make setup`")
    parent = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), f"the parent did not start vLLM: {line!r}"
        vllm_pid = int(line)
        assert _alive(vllm_pid)
        started = [_cmdline(pid) for pid in _group(vllm_pid)]
        vllm = [c for c in started if "resource_tracker" not in c]  # multiprocessing's own helper aside
        if is_cpu_build(vllm_python() or Path(sys.executable)):
            assert len(vllm) == 2, f"vLLM runs as {vllm}, expected its API server and engine core only"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 60
        while _group(vllm_pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _group(vllm_pid), "vLLM outlived the process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()
