"""A :class:`~agentforge.trainers.grpo_trainer.LightningTrainer` over GRPO groups already in a store (offline
GRPO's ``StoredGroupSource``) on the tiny model, with a publisher that only records: real TRL steps in seconds,
no runner, gateway or engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiny_model import tiny_model

from agentforge.ports import TraceStore
from agentforge.trainers.replay.select import TraceFilter, select_traces

__all__ = ["RecordingPublisher", "stored_group_trainer"]


class RecordingPublisher:
    """Serves ``policy@v{n}`` after ``n`` publishes; records each published adapter folder."""

    def __init__(self) -> None:
        self.dirs: list[Path] = []

    def current(self) -> str:
        return f"policy@v{len(self.dirs)}"

    def publish(self, adapter_dir: Path, step: int) -> str:
        self.dirs.append(Path(adapter_dir))
        return self.current()


def stored_group_trainer(
    out: Path, store: TraceStore, agent: str, group_size: int = 2, **config_kw: Any
) -> tuple[Any, RecordingPublisher]:
    """A trainer on ``agent``'s stored groups: one group per step, one step, a publish after it.

    Args:
        out: the run's ``output_dir``.
        store: holds the scored rollouts (e.g. :func:`tiny_model.scored_rollout`).
        agent: whose rollouts to train on.
        group_size: ``G``.
        **config_kw: :class:`~agentforge.trainers.grpo_config.TrainConfig` fields overriding the defaults here.

    Returns:
        ``(LightningTrainer, RecordingPublisher)``.
    """
    from agentforge.trainers.grpo_config import TrainConfig
    from agentforge.trainers.grpo_trainer import LightningTrainer
    from agentforge.trainers.replay.grpo import StoredGroupSource

    groups = select_traces(store, TraceFilter(agent=agent, require_reward=False)).groups()
    fields: dict[str, Any] = dict(
        output_dir=str(out), num_generations=group_size, tasks_per_step=1, max_steps=1, swap_every=1,
        learning_rate=1e-2, lora_r=4, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
        bf16=False, seed=0, gradient_checkpointing=False,
    )  # fmt: skip
    fields.update(config_kw)
    publisher = RecordingPublisher()
    source = StoredGroupSource(groups, group_size)
    return LightningTrainer(
        tiny_model(), store, None, TrainConfig(**fields), publisher, source=source
    ), publisher
