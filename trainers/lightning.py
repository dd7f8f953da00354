"""The lightning trainer: GRPO with a LoRA adapter through TRL, fed by rollouts the agents really ran.

Loop (one optimizer step):

1. TRL's sampler yields ``tasks_per_step`` task ids, each repeated ``G`` times.
2. :class:`~agentforge.trainers.rollouts.RolloutSource` (TRL's ``rollout_func``) enqueues one rollout per
   entry pinned to the version serving now, waits for runners (any process) to finish them through the
   gateway, and returns token-exact samples built from the stored spans, with the stored rewards.
3. ``trl.GRPOTrainer`` computes group-relative advantages (Shao et al. 2024, "DeepSeekMath", GRPO) and
   takes one step on the LoRA adapter (``peft``). The engine's stored logprobs feed TRL's importance
   sampling correction for the train/serve mismatch (TRL ``vllm_importance_sampling_correction``).
4. Every ``swap_every`` steps the adapter is saved, published as a new version in the store and
   hot-swapped into serving (canary first) by the :class:`AdapterPublisher`.

TRL only knows how to sync weights into its own vLLM; here the serving engine is ours, so the trainer
plugs a small object into TRL's generation-backend slot whose ``sync_weights()`` is the publish step. TRL
calls it exactly when it would sync vLLM: before the first generation after an optimizer step.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentforge.errors import MissingExtraError, NotFoundError
from agentforge.stores.base import TraceStore
from agentforge.trainers.config import TrainConfig
from agentforge.trainers.publish import AdapterPublisher
from agentforge.trainers.rollouts import RolloutSource, stored_reward
from agentforge.types import Span, SpanKind, Task

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtraError("transformers", "train", "the lightning trainer") from exc

__all__ = ["LightningTrainer"]

logger = logging.getLogger("agentforge.trainer")


class _ServingSync:
    """Occupies TRL's generation-backend slot; TRL calls ``sync_weights`` after optimizer steps."""

    def __init__(self, owner: LightningTrainer) -> None:
        self.owner = owner

    def sync_weights(self) -> None:
        self.owner.maybe_publish()


class _MetricsCallback(TrainerCallback):
    """Copies TRL's logged metrics, the batch report and the served version into the history and the store."""

    def __init__(self, owner: LightningTrainer) -> None:
        self.owner = owner

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any
    ) -> None:
        if not logs or "loss" not in logs and "reward" not in logs:
            return
        self.owner.record_metrics(int(state.global_step), logs)


class LightningTrainer:
    """GRPO + LoRA on rollouts executed by external runners, with hot-swapped adapter versions.

    Args:
        model: base checkpoint directory (the one serving loads), e.g. the prepared default model.
        store: the trace store shared with the gateway and the runners.
        tasks: training tasks; each step samples ``config.tasks_per_step`` of them.
        config: :class:`TrainConfig` (TRL's ``GRPOConfig`` + agentforge fields).
        publisher: publishes each saved adapter as a new served version.

    Attributes:
        history: one dict of metrics per logged step (also written to the store as ``trainer.metrics``
            spans, orphans with ``attributes.run_id``).
        versions: the versions published by this run, in order.
    """

    def __init__(
        self,
        model: str | Path,
        store: TraceStore,
        tasks: Sequence[Task],
        config: TrainConfig,
        publisher: AdapterPublisher,
    ) -> None:
        try:
            from datasets import Dataset
            from transformers import AutoTokenizer
            from trl import GRPOTrainer
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingExtraError(exc.name or "trl", "train", "the lightning trainer") from exc

        self.model_path, self.store, self.config, self.publisher = str(model), store, config, publisher
        self.tasks = {t.task_id: t for t in tasks}
        self.history: list[dict[str, Any]] = []
        self.versions: list[str] = []
        self._published_step = -1
        self._resuming = False
        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.source = RolloutSource(
            store,
            self.tasks,
            config.num_generations,
            publisher.current,
            alias=config.alias,
            placeholder_token_id=int(tokenizer.eos_token_id or 0),
            agent=config.agent_name,
            timeout_s=config.rollout_timeout_s,
            max_attempts=config.rollout_max_attempts,
            wait_timeout_s=config.wait_timeout_s,
            max_staleness=config.max_staleness,
        )
        self.source.run_id = self._stable_run_id()
        dataset = Dataset.from_list([{"prompt": task_id} for task_id in self.tasks])
        self.trainer = GRPOTrainer(
            model=self.model_path,
            reward_funcs=[stored_reward],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=config.lora_config(),
            rollout_func=self.source,
            callbacks=[_MetricsCallback(self)],
        )
        # Route TRL's "sync weights into vLLM" and its importance-sampling correction to our serving.
        self.trainer.use_vllm = True
        self.trainer.vllm_generation = _ServingSync(self)
        self.trainer._last_loaded_step = 0

    def _stable_run_id(self) -> str:
        """The run id, kept in ``{output_dir}/agentforge-run.json`` so a resumed run keeps its identity."""
        path = Path(self.config.output_dir) / "agentforge-run.json"
        if path.exists():
            return str(json.loads(path.read_text())["run_id"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"run_id": self.source.run_id}))
        return self.source.run_id

    @property
    def run_id(self) -> str:
        """Identifies this run on its rollouts (``metadata.trainer_run``) and metric spans."""
        return self.source.run_id

    @property
    def adapter_dir(self) -> Path:
        """Where published adapters are saved (``{output_dir}/adapters/step-N``)."""
        return Path(self.config.output_dir) / "adapters"

    def train(self, resume_from_checkpoint: bool | str | None = None) -> dict[str, Any]:
        """Run ``config.max_steps`` optimizer steps, publishing every ``swap_every`` and at the end.

        Args:
            resume_from_checkpoint: ``True`` resumes from the last checkpoint in ``output_dir``
                (after a crash or ``kill -9``); a path resumes from that checkpoint.

        Returns:
            ``{"steps", "versions", "history"}``.

        Raises:
            RolloutTimeout: no runner finished any rollout of a batch within ``wait_timeout_s``.
            ServingError / AdapterIncompatibleError: publishing an adapter failed (the previous version
                keeps serving).
        """
        if resume_from_checkpoint is True and not list(Path(self.config.output_dir).glob("checkpoint-*")):
            resume_from_checkpoint = None  # nothing to resume yet: a fresh start
        if resume_from_checkpoint and hasattr(self.publisher, "restore"):
            self.publisher.restore()  # serve the store's latest version again before sampling
        self.trainer._last_loaded_step = 0
        self._resuming = bool(resume_from_checkpoint)
        self.trainer.train(resume_from_checkpoint=resume_from_checkpoint)
        self.trainer._last_loaded_step = self.trainer.state.global_step
        self.maybe_publish(force=True)
        return {
            "steps": self.trainer.state.global_step,
            "versions": list(self.versions),
            "history": self.history,
        }

    def maybe_publish(self, force: bool = False) -> str | None:
        """Save and publish the adapter if ``swap_every`` steps passed since the last publish (or ``force``).

        Returns:
            The new version, or ``None`` when nothing was published.
        """
        step = int(self.trainer.state.global_step)
        if self._resuming:  # first sync after a resume: skip if the checkpoint's adapter already serves
            self._resuming = False
            if self._served_step() >= step:
                self._published_step = step
        if step == 0 or step == self._published_step:
            return None
        if not force and step % self.config.swap_every:
            return None
        path = self.adapter_dir / f"step-{step}"
        self.trainer.model.save_pretrained(path)
        version = self.publisher.publish(path, step)
        self._published_step = step
        self.versions.append(version)
        logger.info("step %d: published %s", step, version)
        return version

    def _served_step(self) -> int:
        """The training step of the adapter version the store has active (-1 if none)."""
        try:
            return int(self.store.get_resource(self.config.alias).payload.get("step", -1))
        except NotFoundError:  # nothing published yet
            return -1

    def record_metrics(self, step: int, logs: dict[str, float]) -> None:
        """Append one history row (TRL logs + batch report + served version) and store it as a span."""
        row: dict[str, Any] = {"step": step, "version": self.publisher.current()}
        row.update({k: float(v) for k, v in logs.items() if isinstance(v, int | float)})
        if self.source.reports:
            row.update(self.source.reports[-1].metrics())
        self.history.append(row)
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in row.items()}
        try:
            self.store.add_span(
                Span(
                    kind=SpanKind.custom, name="trainer.metrics", attributes={"run_id": self.run_id, **clean}
                )
            )
        except Exception:  # metrics must never stop training
            logger.exception("could not store trainer metrics for step %d", step)
        metrics_path = Path(self.config.output_dir) / "metrics.jsonl"
        metrics_path.parent.mkdir(parents=True, exist_ok=True)
        with metrics_path.open("a") as fh:
            fh.write(json.dumps(clean) + "\n")
