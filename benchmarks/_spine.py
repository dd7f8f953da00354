"""Shared pieces of the spine benchmarks (``store.py``, ``gateway.py``): realistic spans, loopback servers in
child processes, CPU time read from ``/proc`` and percentiles.

Servers run in their own processes so that clients and server do not share one interpreter lock: the
figures are what a deployment sees, not what one Python thread can interleave.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agentforge.types import LLMCall, Span, SpanKind

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def llm_span(rollout_id: str | None, i: int) -> Span:
    """A span shaped like one the gateway writes for a short chat call (60 prompt ids, 24 sampled ids)."""
    prompt = list(range(1000 + i, 1060 + i))
    completion = list(range(2000 + i, 2024 + i))
    llm = LLMCall(
        model="policy",
        version="policy@v1",
        endpoint="chat",
        request={"model": "policy", "messages": [{"role": "user", "content": f"Where is my order #{i}? ✨"}]},
        sampling={"temperature": 1.0, "max_tokens": 24},
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-0.25 - k / 100 for k in range(24)],
        response_text="Your order ships tomorrow, tracking number follows.",
        finish_reason="stop",
        usage={"prompt_tokens": 60, "completion_tokens": 24, "total_tokens": 84},
        latency_s=0.012,
    )
    return Span(
        rollout_id=rollout_id,
        kind=SpanKind.llm,
        name="chat.completions",
        llm=llm,
        attributes={"endpoint": "chat"},
    )


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class ChildServer:
    """A Python server started as ``python -c CODE`` in a child process, bound to 127.0.0.1.

    Args:
        code: the program; it reads its port from ``sys.argv[1]``.
        port: the port; ``health`` is polled at ``http://127.0.0.1:<port><health>`` until it answers.
        timeout_s: how long it may take to answer, seconds.
    """

    def __init__(
        self,
        code: str,
        port: int,
        health: str = "/health",
        env: dict[str, str] | None = None,
        timeout_s: float = 60.0,
    ):
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(port)], cwd=ROOT, env={**os.environ, **(env or {})}
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + health, timeout=1).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server on port {port} did not start")
            time.sleep(0.1)

    def cpu_s(self) -> float:
        """User + system CPU seconds the child has used so far (``/proc/<pid>/stat``)."""
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        """Terminate the child and wait for it."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0–100) of ``values`` by nearest rank; ``nan`` for an empty list."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]
