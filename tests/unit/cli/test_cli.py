"""The ``agentforge`` command line as a new user runs it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fixtures_store import serve_app
from openai import OpenAI

from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore
from agentforge.types import Rollout, SpanKind, rollout_base_url

CLI = [sys.executable, "-m", "agentforge.cli"]
STORE_KEY = "store-key-for-the-cli-test"  # a store server key has at least 16 characters


def test_help_lists_the_commands() -> None:
    out = subprocess.run([*CLI, "--help"], capture_output=True, text=True, check=True).stdout
    assert "model" in out and "serve" in out


def test_model_prepare_prints_the_checkpoint_path() -> None:
    out = subprocess.run([*CLI, "model", "prepare"], capture_output=True, text=True, check=True).stdout
    assert (Path(out.strip()) / "config.json").exists()


def test_serve_refuses_a_public_interface_without_an_api_key(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            *CLI,
            "serve",
            "--backend",
            "embedded",
            "--host",
            "0.0.0.0",
            "--store-url",
            f"sqlite:///{tmp_path}/t.db",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "api" in proc.stderr.lower()


@pytest.mark.slow
def test_serve_embedded_records_calls_until_interrupted(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = f"sqlite:///{tmp_path / 'traces.db'}"
    proc = subprocess.Popen(
        [*CLI, "serve", "--backend", "embedded", "--port", str(port), "--store-url", db],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=_as_a_background_job,  # SIGINT inherited as ignored: serve must stop on it all the same
    )
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
        # serve mounts the dashboard on the gateway's port: the call just made, token by token
        page = httpx.get(f"{url}/dashboard/rollouts/{rollout.rollout_id}", timeout=60)
        assert page.status_code == 200 and "policy@v0" in page.text and "tok trained" in page.text
        store.close()
        proc.send_signal(signal.SIGINT)
        assert _stopped(proc) == 0
        assert "stopped (interrupt): store follower, gateway" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def _as_a_background_job() -> None:
    """Start the child as a shell starts a background job (``agentforge serve &`` in a script): SIGINT
    ignored, which Python keeps when nothing installs a handler (runs in the child before ``exec``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stopped(proc: subprocess.Popen[str], timeout_s: float = 90.0) -> int:
    """The exit status of a ``serve`` that was just interrupted. A stop that hangs (it did in full-suite runs
    started in the background, whose SIGINT was inherited as ignored, until serve installed its own handler)
    fails with the process's threads' stacks (py-spy, where installed) and its stderr."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        spy = Path(sys.executable).with_name("py-spy")
        stacks = (
            subprocess.run(
                [str(spy), "dump", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=60
            ).stdout
            if spy.exists()
            else "(no py-spy)"
        )
        proc.kill()
        pytest.fail(f"serve did not stop within {timeout_s} s\n{stacks}\n{proc.stderr.read()[-3000:]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env_without_keys() -> dict[str, str]:
    drop = ("AGENTFORGE_API_KEY", "AGENTFORGE_STORE_API_KEY")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONUNBUFFERED": "1"}


def test_serve_refuses_a_store_server_that_rejects_its_key_before_starting_the_engine(tmp_path: Path) -> None:
    backing = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    with serve_app(create_store_app(backing, api_key=STORE_KEY)) as store_url:
        proc = subprocess.run(
            [*CLI, "serve", "--backend", "embedded", "--port", str(_free_port()), "--store-url", store_url],
            capture_output=True,
            text=True,
            timeout=300,
            env=_env_without_keys(),
        )
    backing.close()
    assert proc.returncode == 2, proc.stderr
    assert "rejected" in proc.stderr and "--store-api-key" in proc.stderr and "starting" not in proc.stderr


@pytest.mark.slow
def test_serve_with_an_http_store_url_records_into_the_running_store_server(tmp_path: Path) -> None:
    backing = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    port = _free_port()
    with serve_app(create_store_app(backing, api_key=STORE_KEY)) as store_url:
        proc = subprocess.Popen(
            [
                *CLI,
                "serve",
                "--backend",
                "embedded",
                "--port",
                str(port),
                "--store-url",
                store_url,
                "--store-api-key",
                STORE_KEY,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env_without_keys(),
        )
        try:
            url = proc.stdout.readline().strip()
            assert url == f"http://127.0.0.1:{port}", proc.stderr.read() if proc.poll() is not None else url
            rollout = backing.enqueue_rollout(Rollout())
            client = OpenAI(base_url=rollout_base_url(url, rollout.rollout_id), api_key="unused")
            out = client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
            )
            assert out.model == "policy@v0"
            deadline = time.monotonic() + 10  # the gateway's HTTP store writes in batches
            while not (spans := backing.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm)):
                assert time.monotonic() < deadline, "the call never reached the store server"
                time.sleep(0.05)
            (span,) = spans
            assert span.llm.version == "policy@v0" and span.llm.trainable
            assert len(span.llm.completion_token_ids) == len(span.llm.logprobs) > 0
            proc.send_signal(signal.SIGINT)
            assert _stopped(proc) in (0, 130)
        finally:
            if proc.poll() is None:
                proc.kill()
    backing.close()
