"""Tests of what ``agentforge serve`` / the stack would ask vLLM to run, without starting an engine:
``VLLMServer.start`` records the command line and raises :data:`STOPPED` instead."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentforge.cli import app
from agentforge.errors import ServingError
from agentforge.serving.vllm import VLLMServer

__all__ = ["STOPPED", "starts", "serve_vllm"]

STOPPED = "stopped by the test before the engine started"


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The command lines ``VLLMServer.start`` was asked to run (it then raises instead of starting)."""
    monkeypatch.setenv("AGENTFORGE_VLLM_PYTHON", sys.executable)  # VLLMServer() only checks it exists
    seen: list[list[str]] = []

    def start(self: VLLMServer) -> None:
        seen.append(self.command())
        raise ServingError(STOPPED)

    monkeypatch.setattr(VLLMServer, "start", start)
    return seen


def serve_vllm(tmp_path: Path, *args: str):  # type: ignore[no-untyped-def]
    """``agentforge serve --backend vllm`` with a store in ``tmp_path`` and ``args``: the CliRunner result."""
    db = f"sqlite:///{tmp_path / 't.db'}"
    return CliRunner().invoke(
        app, ["serve", "--backend", "vllm", "--store-url", db, *args], env={"COLUMNS": "300"}
    )
