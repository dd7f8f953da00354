"""Training metrics reach TensorBoard through TRL's ``report_to``: ``agentforge replay grpo --report-to tensorboard``
runs real GRPO steps (tiny model, stored groups) and its event files hold the reward of every step, the same
numbers as ``metrics.jsonl``. A name transformers has no integration for fails before any work, saying so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_model import tiny_model
from typer.testing import CliRunner

from agentforge.cli import app
from agentforge.stores.sql import SQLStore
from agentforge.types import LLMCall, Reward, Rollout, RolloutState, Span, SpanKind, Task

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

AGENT = "tb-replay"
PROMPT = [1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198]  # <|im_start|>user\nhi<|im_end|>\n + header


def _scored(store: SQLStore, group: str, completion: list[int], reward: float) -> None:
    rollout = store.enqueue_rollout(Rollout(agent=AGENT, group_id=group, task=Task(task_id=group)))
    store.update_rollout(rollout.rollout_id, state=RolloutState.running)
    call = LLMCall(version="policy@v0", prompt_token_ids=PROMPT, completion_token_ids=completion,
                   logprobs=[-1.0] * len(completion), finish_reason="stop")  # fmt: skip
    store.add_span(Span(kind=SpanKind.llm, rollout_id=rollout.rollout_id, name="llm", llm=call))
    store.add_reward(Reward(rollout_id=rollout.rollout_id, value=reward, final=True))
    store.update_rollout(rollout.rollout_id, state=RolloutState.succeeded)


@pytest.mark.slow
def test_replay_grpo_reports_the_reward_of_every_step_to_tensorboard(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    store = SQLStore(url)
    for group, (a, b) in {"g1": (1.0, 0.0), "g2": (1.0, 1.0)}.items():
        _scored(store, group, [57, 1431, 2], a)
        _scored(store, group, [36, 2], b)
    store.close()
    out = tmp_path / "run"
    args = ["replay", "grpo", "--store-url", url, "--output-dir", str(out), "--model", str(tiny_model()),
            "--agent", AGENT, "--group-size", "2", "--groups-per-step", "1", "--report-to", "tensorboard"]  # fmt: skip
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
    [("tensorbord", "--report-to tensorbord: not an integration; use none or some of"),
     ("nosuch,tensorboard", "--report-to nosuch: not an integration")],
)  # fmt: skip
def test_an_unknown_integration_fails_before_any_work(tmp_path: Path, value: str, message: str) -> None:
    result = CliRunner().invoke(
        app, ["replay", "sft", "--store-url", f"sqlite:///{tmp_path / 'none.db'}", "--report-to", value]
    )
    assert result.exit_code != 0 and message in result.output, result.output
    assert not (tmp_path / "none.db").exists()  # failed before the store was opened
