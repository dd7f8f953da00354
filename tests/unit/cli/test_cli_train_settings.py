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


def test_train_splits_a_step_by_the_row_budget_and_says_how_memory_grows(captured) -> None:  # type: ignore[no-untyped-def]
    _train("--group-size", "8", "--max-rows-per-micro-batch", "2")
    config = captured["config"]
    assert (config.gradient_accumulation_steps, config.per_device_train_batch_size) == (4, 2)
    _train("--group-size", "8")  # the default budget: one group of 8 per micro-batch
    assert captured["config"].gradient_accumulation_steps == 1
    assert captured["config"].max_rows_per_micro_batch == 8
    wide = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "250"}).output  # option names whole
    help_text = " ".join(wide.replace("│", " ").split())
    assert "--max-rows-per-micro-batch" in help_text and "not with rollouts per step" in help_text


def test_train_takes_trajectories_per_rollout_for_parallel_branches(captured) -> None:  # type: ignore[no-untyped-def]
    _train("--group-size", "4", "--trajectories-per-rollout", "2")
    assert captured["config"].trajectories_per_rollout == 2 and captured["config"].num_generations == 4
    _train("--group-size", "4")
    assert captured["config"].trajectories_per_rollout == 1
    odd = CliRunner().invoke(
        app,
        [
            "train",
            "shop_agent.py:agent",
            "--tasks",
            "tasks.jsonl",
            "--group-size",
            "3",
            "--trajectories-per-rollout",
            "2",
        ],
    )
    assert odd.exit_code != 0 and "trajectories_per_rollout=2 must be >= 1 and divide" in odd.output


def test_train_takes_the_negative_advantage_scale_and_refuses_a_negative_one(captured) -> None:  # type: ignore[no-untyped-def]
    _train()
    assert captured["config"].negative_advantage_scale == 1.0  # GRPO as published
    _train("--negative-advantage-scale", "0.25")
    assert captured["config"].negative_advantage_scale == 0.25
    result = CliRunner().invoke(
        app, ["train", "shop_agent.py:agent", "--tasks", "tasks.jsonl", "--negative-advantage-scale", "-1"]
    )
    assert result.exit_code == 2 and "--negative-advantage-scale" in result.output
