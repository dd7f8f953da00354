"""Earlier adapter versions kept loaded (``retain``, the trainer's ``max_staleness``) reach serving from
``agentforge serve --retain``, ``agentforge train --max-staleness`` and ``LocalStack(retain=)``, with vLLM's
adapter limits (``--max-loras``, ``--max-cpu-loras``); limits that cannot hold ``retain + 1`` served versions
plus the one being loaded are refused before the engine's slow start (issue 16, adapter slots).

No engine starts here: ``VLLMServer.start`` is replaced by one that records the command it would run and
stops the command there, so these tests need neither vLLM nor its start-up minute.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fixtures_cli import STOPPED, serve_vllm
from typer.testing import CliRunner

from agentforge.cli import app
from agentforge.errors import ConfigError, ServingError


def _flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def test_serve_refuses_limits_that_cannot_hold_the_retained_versions_before_starting(
    tmp_path: Path, starts: list[list[str]]
) -> None:
    result = serve_vllm(tmp_path, "--retain", "3")  # --max-loras 4 holds 2 served versions + 1 loading
    assert result.exit_code == 2, result.output
    text = re.sub(r"\s+", " ", result.output)
    assert "retain=3" in text and "needs 4 served versions plus the one being loaded = 5" in text
    assert "--max-cpu-loras 5" in text  # says what to start it with
    assert starts == [] and "starting vllm" not in text  # refused before the slow start


def test_serve_passes_its_adapter_limits_to_vllm(tmp_path: Path, starts: list[list[str]]) -> None:
    result = serve_vllm(tmp_path, "--retain", "3", "--max-loras", "2", "--max-cpu-loras", "5")
    assert result.exit_code == 2 and STOPPED in result.output, result.output  # the check passed
    (command,) = starts
    assert _flag(command, "--max-loras") == "2" and _flag(command, "--max-cpu-loras") == "5"
    default = serve_vllm(tmp_path)  # --retain 1 by default (train's max_staleness): 3 of --max-loras 4
    assert default.exit_code == 2 and STOPPED in default.output, default.output
    assert _flag(starts[1], "--max-loras") == "4" and _flag(starts[1], "--max-cpu-loras") is None


def test_serve_options_are_checked(tmp_path: Path, starts: list[list[str]]) -> None:
    below = serve_vllm(tmp_path, "--max-loras", "4", "--max-cpu-loras", "3")
    assert below.exit_code == 2 and "must be >= max_loras=4" in below.output, below.output
    assert serve_vllm(tmp_path, "--retain", "-1").exit_code == 2
    assert serve_vllm(tmp_path, "--max-loras", "1").exit_code == 2
    assert starts == []
    text = re.sub(r"[\s│]+", " ", CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "300"}).output)
    assert "--retain" in text and "max_staleness" in text and "--max-cpu-loras" in text


def test_local_stack_checks_retain_against_the_engine_before_starting_it(starts: list[list[str]]) -> None:
    from agentforge.stack import LocalStack
    from agentforge.testing import memory_store

    store = memory_store()
    with pytest.raises(ConfigError, match=r"retain=2 .* --max-cpu-loras 4"):
        LocalStack(store, retain=2, max_loras=3).start()
    assert starts == []
    stack = LocalStack(store, retain=2, max_loras=2, max_cpu_loras=4)
    with pytest.raises(ServingError, match=STOPPED):
        stack.start()
    assert stack.swapper is not None and stack.swapper.retain == 2 and stack.swapper.capacity == 4
    (command,) = starts
    assert _flag(command, "--max-loras") == "2" and _flag(command, "--max-cpu-loras") == "4"
    store.close()


def test_train_keeps_max_staleness_versions_loaded(tmp_path: Path, starts: list[list[str]]) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"input": {"q": i}}) + "\n" for i in range(4)))
    args = [
        "train",
        "runtime_agents:one_call_agent",
        "--tasks",
        str(tasks),
        "--output-dir",
        str(tmp_path / "run"),
        "--backend",
        "vllm",
    ]
    refused = CliRunner().invoke(app, [*args, "--max-staleness", "3"], env={"COLUMNS": "300"})
    assert refused.exit_code == 2, refused.output
    assert "retain=3 (the trainer's max_staleness)" in re.sub(r"\s+", " ", refused.output)
    assert starts == []
    taken = CliRunner().invoke(
        app, [*args, "--max-staleness", "3", "--max-cpu-loras", "5"], env={"COLUMNS": "300"}
    )
    assert taken.exit_code == 1 and STOPPED in taken.output, taken.output
    assert _flag(starts[0], "--max-cpu-loras") == "5"
