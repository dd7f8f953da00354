"""Training metrics reach TensorBoard through TRL's ``report_to``: ``agentforge replay grpo --report-to tensorboard``
runs real GRPO steps (tiny model, stored groups) and its event files hold the reward of every step, the same
numbers as ``metrics.jsonl``. A name transformers has no integration for fails before any work, saying so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_model import scored_rollout, tiny_model
from typer.testing import CliRunner

from agentforge.cli import app
from agentforge.stores.sql import SQLStore

AGENT = "tb-replay"


@pytest.mark.slow
def test_replay_grpo_reports_the_reward_of_every_step_to_tensorboard(tmp_path: Path) -> None:
    # imported here, not at the top: only the worker that runs it pays for tensorboard (~0.6 s)
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    store = SQLStore(url)
    for group, (a, b) in {"g1": (1.0, 0.0), "g2": (1.0, 1.0)}.items():
        scored_rollout(store, AGENT, group, [57, 1431, 2], a)
        scored_rollout(store, AGENT, group, [36, 2], b)
    store.close()
    out = tmp_path / "run"
    args = [
        "replay",
        "grpo",
        "--store-url",
        url,
        "--output-dir",
        str(out),
        "--model",
        str(tiny_model()),
        "--agent",
        AGENT,
        "--group-size",
        "2",
        "--groups-per-step",
        "1",
        "--report-to",
        "tensorboard",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    (events,) = list((out / "runs").rglob("events.out.tfevents.*"))  # transformers' TensorBoardCallback
    scalars = event_accumulator.EventAccumulator(str(events.parent)).Reload()
    rewards = scalars.Scalars("train/reward")
    assert [e.step for e in rewards] == [1, 2]
    assert [e.value for e in rewards] == pytest.approx([r["reward"] for r in rows]) == [0.5, 1.0]
    assert "train/loss" in scalars.Tags()["scalars"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("tensorbord", "--report-to tensorbord: not an integration; use none or some of"),
        ("nosuch,tensorboard", "--report-to nosuch: not an integration"),
    ],
)
def test_an_unknown_integration_fails_before_any_work(tmp_path: Path, value: str, message: str) -> None:
    result = CliRunner().invoke(
        app, ["replay", "sft", "--store-url", f"sqlite:///{tmp_path / 'none.db'}", "--report-to", value]
    )
    assert result.exit_code != 0 and message in result.output, result.output
    assert not (tmp_path / "none.db").exists()  # failed before the store was opened
