"""Shared helpers for the serving tests: greedy letter requests, span checks through the gateway, and the
few-shot tool-calling conversation (see ``test_serving_tools``), a fake ``PolicyServer`` for bookkeeping and
one backed by a real process group for the supervision tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
from adapters import LETTER_MESSAGES
from fixtures_serving import WEATHER_TOOL

from agentforge.config import default_model_dir
from agentforge.errors import ServingError
from agentforge.gateway.server import GatewayServer
from agentforge.types import Rollout, Span


def ask_letter(
    base_url: str,
    model: str,
    *,
    client: httpx.Client | None = None,
    timeout_s: float = 120.0,
    api_key: str | None = None,
) -> str:
    """Greedy answer of ``model`` to the letter prompt (asserts token ids came back); ``api_key``: the
    engine's key when ``base_url`` is an engine (not the gateway)."""
    body = {
        "model": model,
        "messages": LETTER_MESSAGES,
        "temperature": 0,
        "max_tokens": 4,
        "logprobs": True,
        "return_token_ids": True,
    }
    post = client.post if client is not None else httpx.post
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    response = post(f"{base_url}/chat/completions", json=body, headers=headers, timeout=timeout_s)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["token_ids"], choice
    return choice["message"]["content"]


def new_rollout(gateway: GatewayServer) -> str:
    """Enqueue a rollout in the gateway's store; returns its id (use ``{url}/rollouts/{id}/v1``)."""
    return gateway.store.enqueue_rollout(Rollout()).rollout_id  # type: ignore[attr-defined]


def llm_spans(gateway: GatewayServer, rollout_id: str) -> list[Span]:
    """The LLM spans recorded for a rollout, in order."""
    return [s for s in gateway.store.list_spans(rollout_id=rollout_id) if s.llm is not None]  # type: ignore[attr-defined]


WEATHER = {"London": "rainy, 12 C", "Berlin": "cloudy, 15 C", "Paris": "sunny, 21 C", "Tokyo": "humid, 27 C"}


def call(city: str) -> dict:
    arguments = json.dumps({"city": city})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{city.lower()}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": arguments},
            }
        ],
    }


def result(city: str) -> dict:
    return {"role": "tool", "tool_call_id": f"call_{city.lower()}", "content": WEATHER[city]}


def example(city: str) -> list[dict]:
    answer = f"It is {WEATHER[city].split(',')[0]} and {WEATHER[city].split(', ')[1]} in {city}."
    return [
        {"role": "user", "content": f"What is the weather in {city}?"},
        call(city),
        result(city),
        {"role": "assistant", "content": answer},
    ]


#: The few-shot prefix that makes SmolLM2-135M call the tool greedily.
FEW_SHOT = example("London") + example("Berlin")

__all__ = [
    "ask_letter",
    "new_rollout",
    "llm_spans",
    "WEATHER",
    "WEATHER_TOOL",
    "FEW_SHOT",
    "call",
    "result",
    "example",
    "FakeServer",
    "ProcessEngine",
    "vllm_child",
]


class FakeServer:
    """A PolicyServer that records loads (for HotSwapper bookkeeping tests)."""

    base_model = str(default_model_dir())
    max_lora_rank = 16
    base_url = "http://fake/v1"
    base_model_name = "base"

    def __init__(self, max_loras: int, max_cpu_loras: int | None = None) -> None:
        self.max_loras, self.max_cpu_loras, self.loaded = max_loras, max_cpu_loras, []

    def start(self) -> None: ...
    def stop(self) -> None: ...

    def load_adapter(self, name: str, path: str) -> None:
        self.loaded.append(name)

    def unload_adapter(self, name: str) -> None:
        self.loaded.remove(name)

    def adapters(self) -> list[str]:
        return list(self.loaded)


class ProcessEngine(FakeServer):
    """A FakeServer backed by a real process group standing in for vLLM: ``sh`` with two ``sleep`` children
    in their own process group (like vLLM's API server and its engine core), so killing the leader with
    SIGKILL leaves the children running until someone clears the group. A start takes ``start_s`` seconds,
    or fails while ``fail_starts`` is set; a fresh start serves no adapter."""

    api_key = "k" * 32

    def __init__(self, start_s: float = 0.5) -> None:
        super().__init__(max_loras=4)
        self.start_s, self.fail_starts, self.starts = start_s, False, 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def start(self) -> None:
        time.sleep(self.start_s)
        if self.fail_starts:
            raise ServingError("the engine did not come up")
        self._proc = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600 & wait"], start_new_session=True)
        self.loaded, self.starts = [], self.starts + 1

    def stop(self, grace_s: float = 15.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)

    def load_adapter(self, name: str, path: str) -> None:
        self._answers("/load_lora_adapter")
        super().load_adapter(name, path)

    def unload_adapter(self, name: str) -> None:
        self._answers("/unload_lora_adapter")
        super().unload_adapter(name)

    def _answers(self, route: str) -> None:
        """Raise as VLLMServer does when nothing answers on its port."""
        if not self.running:
            raise ServingError(
                f"vLLM at {self.base_url} failed on {route}: ConnectError('connection refused')"
            )

    def kill(self) -> None:
        """SIGKILL the whole group (as a crash or the OOM killer would) and wait until the leader is dead."""
        assert self._proc is not None
        os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait(5)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def process_group(pgid: int) -> set[int]:
    """Live (non-zombie) processes whose process group is ``pgid`` (Linux ``/proc``)."""
    import os
    from pathlib import Path

    members = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.add(int(entry))
    return members


def wait_for(condition, timeout_s: float, what: str, step_s: float = 0.2):  # type: ignore[no-untyped-def]
    """Poll ``condition()`` until it returns something truthy (returned); AssertionError after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def vllm_child(parent: int) -> int | None:
    """The vLLM API server started by process ``parent`` (found through /proc's children lists)."""
    from pathlib import Path

    for task in Path(f"/proc/{parent}/task").iterdir():
        for pid in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"vllm.entrypoints.openai.api_server" in cmdline:
                return int(pid)
    return None


@contextlib.contextmanager
def running_serve(args: list[str]) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """Run ``python -m agentforge.cli serve ARGS`` on a free loopback port until the block ends.

    Yields ``(process, url, stderr_lines)``: ``url`` is the gateway address ``serve`` prints first (asserted to be
    on the chosen port); ``stderr_lines`` keeps growing while it runs. On exit ``serve`` gets SIGINT and up to 60 s
    to stop (then SIGKILL); the caller waits for any engine processes it cares about.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "agentforge.cli", "serve", "--port", str(port), *args]
    serve = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(serve.stderr), daemon=True).start()  # type: ignore[arg-type]
    try:
        url = serve.stdout.readline().strip()  # type: ignore[union-attr]
        assert url == f"http://127.0.0.1:{port}", "".join(errors)[-3000:]
        yield serve, url, errors
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
