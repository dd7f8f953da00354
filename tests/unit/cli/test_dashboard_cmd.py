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


def test_the_standalone_dashboard_closes_a_request_that_never_finishes_arriving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36, low: ``agentforge dashboard`` ran a bare ``uvicorn.run``, which holds a connection whose request
    never finishes arriving (slowloris) for ever. It now runs on the gateway's server (read timeout patched to
    1 s here; 60 s by default): the half-sent request is closed and a whole one is still answered."""
    import threading

    from typer.testing import CliRunner

    from agentforge.cli import app
    from agentforge.gateway.server import AppServer

    db = f"sqlite:///{tmp_path / 'traces.db'}"
    SQLStore(db).close()
    monkeypatch.setattr("agentforge.gateway.server.HTTP_REQUEST_READ_S", 1.0)
    stop = threading.Event()
    monkeypatch.setattr("agentforge.commands.dashboard.stop_on_signals", lambda: (stop, ["test"]))
    servers: list[AppServer] = []
    real_start = AppServer.start

    def start(self: AppServer) -> AppServer:
        servers.append(self)
        return real_start(self)

    monkeypatch.setattr(AppServer, "start", start)
    seen: dict[str, object] = {}

    def probe() -> None:
        try:
            for _ in range(600):  # until the dashboard answers a whole request
                try:
                    if servers and servers[0].port:
                        seen["page"] = httpx.get(f"http://127.0.0.1:{servers[0].port}/rollouts", timeout=10)
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            port = servers[0].port
            half = socket.create_connection(("127.0.0.1", port))
            half.sendall(b"GET /rollouts HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
            half.settimeout(10)
            started = time.monotonic()
            try:
                seen["closed"] = half.recv(4096) == b""
            except (TimeoutError, ConnectionResetError) as exc:
                seen["closed"] = isinstance(exc, ConnectionResetError)
            seen["after_s"] = time.monotonic() - started
            half.close()
            seen["after"] = httpx.get(f"http://127.0.0.1:{port}/rollouts", timeout=10).status_code
        finally:
            stop.set()

    prober = threading.Thread(target=probe)
    prober.start()
    result = CliRunner().invoke(app, ["dashboard", "--store-url", db, "--port", "0"])
    prober.join(60)
    assert result.exit_code == 0, result.output
    assert seen["closed"] is True and seen["after_s"] < 9, seen
    assert seen["page"].status_code == 200 and seen["after"] == 200  # type: ignore[attr-defined]
    assert "stopped (test)" in result.output
