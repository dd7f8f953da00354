"""The ``agentforge`` command line as a new user runs it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from openai import OpenAI

from agentforge.stores.sql import SQLStore
from agentforge.types import Rollout, SpanKind

CLI = [sys.executable, "-m", "agentforge.cli"]


def test_help_lists_the_commands() -> None:
    out = subprocess.run([*CLI, "--help"], capture_output=True, text=True, check=True).stdout
    assert "model" in out and "serve" in out


def test_model_prepare_prints_the_checkpoint_path() -> None:
    out = subprocess.run([*CLI, "model", "prepare"], capture_output=True, text=True, check=True).stdout
    assert (Path(out.strip()) / "config.json").exists()


def test_serve_refuses_a_public_interface_without_an_api_key(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*CLI, "serve", "--backend", "embedded", "--host", "0.0.0.0", "--store-url", f"sqlite:///{tmp_path}/t.db"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2 and "api" in proc.stderr.lower()


@pytest.mark.slow
def test_serve_embedded_records_calls_until_interrupted(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = f"sqlite:///{tmp_path / 'traces.db'}"
    proc = subprocess.Popen(
        [*CLI, "serve", "--backend", "embedded", "--port", str(port), "--store-url", db],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        url = proc.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}", proc.stderr.read() if proc.poll() is not None else url
        store = SQLStore(db)
        rollout = store.enqueue_rollout(Rollout())
        client = OpenAI(base_url=f"{url}/rollouts/{rollout.rollout_id}/v1", api_key="unused")
        out = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
        )
        assert out.model == "policy@v0"
        (span,) = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm)
        assert span.llm.trainable and len(span.llm.completion_token_ids) == len(span.llm.logprobs) > 0
        store.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) in (0, 130)
    finally:
        if proc.poll() is None:
            proc.kill()
