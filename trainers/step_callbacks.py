"""The ``transformers.TrainerCallback`` s through which the lightning trainer hooks into every optimizer step.

TRL's documented extension point (STYLE 19): :class:`PublishCallback` publishes (and stages) the adapter where
TRL would sync its own vLLM, :class:`MetricsCallback` times each step and records TRL's logged metrics plus
agentforge's (:meth:`~agentforge.trainers.grpo_trainer.LightningTrainer.step_metrics` /
:meth:`~agentforge.trainers.grpo_trainer.LightningTrainer.record_metrics`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from agentforge.errors import MissingExtraError

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtraError("transformers", "train", "the lightning trainer") from exc

if TYPE_CHECKING:
    from agentforge.trainers.grpo_trainer import LightningTrainer

__all__ = ["MetricsCallback", "PublishCallback"]


class PublishCallback(TrainerCallback):
    """Publishes the adapter after optimizer steps (the owner's ``maybe_publish`` decides whether).

    Runs at the beginning of each optimizer step that generates (TRL generates every
    ``steps_per_generation × num_iterations`` micro-batches, i.e. every ``num_iterations`` optimizer steps,
    since :class:`~agentforge.trainers.grpo_config.TrainConfig` sets ``steps_per_generation`` to
    ``gradient_accumulation_steps``), so the previous step's update serves before the new rollouts are enqueued,
    the first step after a resume serves the checkpoint's adapter, and the last step's adapter is published by
    the owner's ``train`` itself.

    Args:
        owner: the :class:`~agentforge.trainers.grpo_trainer.LightningTrainer` (``maybe_publish``,
            ``maybe_stage``).
    """

    def __init__(self, owner: LightningTrainer) -> None:
        self.owner = owner
        self.first_step = 0  # global step at which this ``train()`` call began (non-zero after a resume)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.first_step = int(state.global_step)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if (int(state.global_step) - self.first_step) % max(1, int(args.num_iterations)) == 0:
            self.owner.maybe_publish()
            self.owner.maybe_stage()


class MetricsCallback(TrainerCallback):
    """Times each optimizer step, adds agentforge's metrics to TRL's, and records every logged step.

    Args:
        owner: the :class:`~agentforge.trainers.grpo_trainer.LightningTrainer` (``source``, ``step_metrics``,
            ``record_metrics``).
    """

    def __init__(self, owner: LightningTrainer) -> None:
        self.owner = owner
        self.t0 = time.monotonic()
        self.seen = 0  # reports already accounted to a step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.t0 = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        mark_trained = getattr(self.owner.source, "mark_trained", None)
        if mark_trained is not None and self.owner.is_main_process:  # the update is done: record it
            mark_trained(int(state.global_step) - 1)
        reports = self.owner.source.reports[self.seen :]
        self.seen = len(self.owner.source.reports)
        self.owner.step_metrics(time.monotonic() - self.t0, reports)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any
    ) -> None:
        if not logs or "loss" not in logs and "reward" not in logs:
            return
        self.owner.record_metrics(int(state.global_step), logs)
