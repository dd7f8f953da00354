"""Issue 18: a step whose every group scored the same (no learning signal) publishes no adapter version.

Real TRL GRPO steps on the tiny model over stored groups (offline GRPO's source): with all rewards equal the
advantages are all 0, the adapter gets no gradient, and no version is published or hot-swapped; the skip is
logged and counted (``publish/skipped_no_signal``). One group with different rewards publishes as before, and
``publish_without_signal=True`` restores publishing every ``swap_every`` steps.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tiny_model import scored_rollout, tiny_model

from agentforge.testing import memory_store
from agentforge.trainers.replay.select import TraceFilter, select_traces

AGENT = "no-signal"


class _Publisher:
    """Records every publish (the hot-swap a real publisher would do)."""

    def __init__(self) -> None:
        self.published: list[int] = []

    def current(self) -> str:
        return f"policy@v{len(self.published)}"

    def publish(self, adapter_dir: Path, step: int) -> str:
        assert Path(adapter_dir).exists()
        self.published.append(step)
        return self.current()


def _train(tmp_path: Path, rewards: dict[str, tuple[float, float]], **config_kw: object):  # type: ignore[no-untyped-def]
    from agentforge.trainers.grpo_config import TrainConfig
    from agentforge.trainers.grpo_trainer import LightningTrainer
    from agentforge.trainers.replay.grpo import StoredGroupSource

    store = memory_store()
    for group, (a, b) in rewards.items():
        scored_rollout(store, AGENT, group, [57, 1431, 2], a)
        scored_rollout(store, AGENT, group, [36, 2], b)
    selection = select_traces(store, TraceFilter(agent=AGENT, require_reward=False))
    config = TrainConfig(
        output_dir=str(tmp_path / "run"),
        num_generations=2,
        tasks_per_step=1,
        max_steps=len(rewards),
        swap_every=1,
        learning_rate=1e-3,
        lora_r=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        gradient_checkpointing=False,
        **config_kw,
    )
    publisher = _Publisher()
    trainer = LightningTrainer(
        tiny_model(), store, None, config, publisher, source=StoredGroupSource(selection.groups(), 2)
    )
    return trainer, trainer.train(), publisher


def test_equal_rewards_publish_no_version(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="agentforge.trainer"):
        trainer, result, publisher = _train(tmp_path, {"g1": (1.0, 1.0), "g2": (0.0, 0.0)})
    assert (
        result["steps"] == 2 and trainer.trainer.batches_scored == 2 and trainer.trainer.signal_batches == 0
    )
    assert publisher.published == [] and result["versions"] == [] and result["skipped_publishes"] == 2
    assert [row["publish/skipped_no_signal"] for row in trainer.history] == [0.0, 1.0]  # step 1's, at step 2
    warned = [r.getMessage() for r in caplog.records if "not publishing" in r.getMessage()]
    assert len(warned) == 2 and "no gradient" in warned[0] and "policy@v0 keeps serving" in warned[0]


def test_a_step_with_signal_publishes_and_the_old_behaviour_is_one_flag_away(tmp_path: Path) -> None:
    trainer, result, publisher = _train(tmp_path / "a", {"g1": (1.0, 0.0), "g2": (1.0, 1.0)})
    assert trainer.trainer.signal_batches == 1
    assert publisher.published == [1] and result["skipped_publishes"] == 1  # step 2 had no signal
    _, result, publisher = _train(tmp_path / "b", {"g1": (1.0, 1.0)}, publish_without_signal=True)
    assert publisher.published == [1] and result["skipped_publishes"] == 0
