"""``agentforge train`` settings a new domain needs: the rollout time limit, the agent name, a start line."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentforge.cli import app


@pytest.fixture
def captured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """A folder with an agent and one task; ``_train`` records its config instead of starting an engine."""
    (tmp_path / "shop_agent.py").write_text("def agent(task, ctx):\n    return 1.0\n", encoding="utf-8")
    (tmp_path / "tasks.jsonl").write_text('{"task_id": "t0", "input": {"q": "hi"}}\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    seen: dict[str, object] = {}

    def fake_train(agent, store, train_tasks, held_out, config, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen["config"] = config
        store.close()
        return {"version": "policy@v0"}

    monkeypatch.setattr("agentforge.commands.train._train", fake_train)
    return seen


def _train(*extra: str) -> object:
    base = ["train", "shop_agent.py:agent", "--tasks", "tasks.jsonl", "--tasks-per-step", "1", "--steps", "1"]
    result = CliRunner().invoke(app, [*base, *extra])
    assert result.exit_code == 0, result.output
    return result


def test_train_takes_the_rollout_time_limit_and_names_its_rollouts_after_the_agent(captured) -> None:  # type: ignore[no-untyped-def]
    result = _train()
    config = captured["config"]
    assert config.rollout_timeout_s == 300.0 and config.agent_name == "shop_agent.py:agent"
    assert "starting the vllm engine with the default model" in result.stderr  # before minutes of silence

    _train("--rollout-timeout", "900", "--agent-name", "bikeshop", "--backend", "embedded")
    config = captured["config"]
    assert config.rollout_timeout_s == 900.0 and config.agent_name == "bikeshop"


def test_train_refuses_a_rollout_time_limit_below_one_second(captured) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(
        app, ["train", "shop_agent.py:agent", "--tasks", "tasks.jsonl", "--rollout-timeout", "0"]
    )
    assert result.exit_code == 2 and "--rollout-timeout" in result.output
    assert "config" not in captured
