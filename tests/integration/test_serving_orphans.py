"""A process that started vLLM and is then killed (SIGKILL: no atexit) leaves no vLLM process behind: not
its API server, nor its engine core or worker (every process of vLLM's process group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from agentforge.config import vllm_python

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
        assert len(_group(vllm_pid)) >= 2  # the API server and at least its engine core
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 60
        while _group(vllm_pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _group(vllm_pid), "vLLM outlived the process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()
