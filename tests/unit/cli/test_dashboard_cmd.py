"""``agentforge dashboard`` as a user runs it: it serves the pages over a store URL and refuses bad set-ups."""

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

from agentforge.stores.sql import SQLStore
from agentforge.types import Reward, Rollout

CLI = [sys.executable, "-m", "agentforge.cli", "dashboard"]


@pytest.mark.slow  # a command's start: a few seconds, more on a loaded machine
def test_dashboard_serves_a_sqlite_store_until_stopped(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'traces.db'}"
    with SQLStore(db) as store:
        rollout = store.enqueue_rollout(Rollout(agent="triage"))
        store.add_reward(Reward(rollout_id=rollout.rollout_id, value=0.5))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [*CLI, "--store-url", db, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url = proc.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}", proc.stderr.read() if proc.poll() is not None else url
        for _ in range(100):  # the URL is printed just before uvicorn binds
            try:
                page = httpx.get(f"{url}/rollouts", timeout=10)
                break
            except httpx.ConnectError:
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.1)
        assert page.status_code == 200 and rollout.rollout_id in page.text and "0.5" in page.text
        assert (
            httpx.get(f"{url}/static/chart.umd.js", timeout=10)
            .headers["content-type"]
            .startswith("text/javascript")
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_dashboard_refuses_a_public_interface_without_a_key_and_a_missing_store(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from agentforge.cli import app

    db = f"sqlite:///{tmp_path / 'traces.db'}"
    runner = CliRunner(env={"AGENTFORGE_API_KEY": None})
    public = runner.invoke(app, ["dashboard", "--store-url", db, "--host", "0.0.0.0"])
    assert public.exit_code == 2 and "api key" in public.output.lower()
    absent = runner.invoke(app, ["dashboard", "--store-url", db])
    assert absent.exit_code == 2 and "no trace store" in absent.output
    assert not (tmp_path / "traces.db").exists()  # a typo never creates an empty store
