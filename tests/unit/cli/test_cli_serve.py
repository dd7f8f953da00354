"""`agentforge serve` as a process: its settings, the engine address it prints, and a clean stop on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from engine_helpers import marked_template, rendered_prompt
from openai import OpenAI

from agentforge.stores.sql import SQLStore

CLI = [sys.executable, "-m", "agentforge.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_until(stream, pattern: str, deadline: float) -> tuple[re.Match[str], list[str]]:  # type: ignore[no-untyped-def]
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen.append(line)
        if match := re.search(pattern, line):
            return match, seen
    raise AssertionError(f"no line matched {pattern!r}; got:\n{''.join(seen)}")


@pytest.mark.slow
def test_serve_prints_the_engine_for_a_customer_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = _free_port()
    db = f"sqlite:///{tmp_path / 'traces.db'}"
    proc = subprocess.Popen(
        [
            *CLI,
            "serve",
            "--backend",
            "embedded",
            "--port",
            str(port),
            "--store-url",
            db,
            "--max-model-len",
            "256",
            "--chat-template",
            str(marked_template(tmp_path)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        engine, _ = _read_until(
            proc.stderr, r"engine (\S+)\s+model (\S+)\s+key (\S+)", time.monotonic() + 300
        )
        assert proc.stdout.readline().strip() == f"http://127.0.0.1:{port}"
        base_url, model, key = engine.groups()
        assert base_url.endswith("/v1") and f":{port}/" not in base_url  # the engine, not the gateway

        customer = OpenAI(base_url=base_url, api_key=key, max_retries=0)
        said = customer.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=2, temperature=0
        )
        assert said.choices[0].message is not None
        from agentforge.config import default_model_dir

        prompt = rendered_prompt(base_url, key, model, str(default_model_dir()))
        assert prompt.startswith("LIBRARY-DESK-MARK")  # --chat-template reached the engine
        with SQLStore(db) as store:  # the customer's call bypassed the gateway: nothing recorded
            assert store.list_spans(orphans=True) == [] and store.list_rollouts() == []

        with pytest.raises(openai.BadRequestError):  # --max-model-len 256 reached the engine
            customer.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "word " * 400}], max_tokens=2
            )

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        rest = proc.stderr.read()
        assert "stopped (SIGTERM)" in rest, rest
        assert f"gateway http://127.0.0.1:{port}" in rest and "embedded engine" in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
