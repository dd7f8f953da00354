"""Rejection-sampling fine-tuning from stored traces: SFT on the rollouts that already succeeded.

The recipe (rejection sampling fine-tuning, RFT: Yuan et al. 2023, "Scaling Relationship on Learning
Mathematical Reasoning with Large Language Models"; the same idea as STaR, Zelikman et al. 2022):

1. select finished rollouts whose reward is at least ``min_reward`` (:func:`~.select.select_traces`);
2. turn each of their token-exact trajectories (:mod:`agentforge.trainers.samples`) into one training
   example **from the stored engine ids** — ``input_ids = prompt_ids + completion_ids``; nothing is
   re-tokenised (DESIGN fact 1);
3. train a LoRA adapter with ``trl.SFTTrainer`` on pre-tokenised data: columns ``input_ids`` and
   ``completion_mask`` (``0`` on the prompt, ``env_mask`` on the completion) with
   ``completion_only_loss=True``, so TRL sets ``labels = -100`` on every token the policy did not sample
   (prompt, tool results, user turns) and the loss covers sampled tokens only; with
   ``share_prompt_prefix`` (default) the prompts' common head runs once per batch
   (:mod:`~agentforge.trainers.replay.prefix_sft`), same loss and gradients;
4. save the adapter, publish it as a new version (``policy@vN``, hot-swapped into serving by a
   :class:`~agentforge.serving.publisher.HotSwapPublisher`) and record the job in the store as one
   ``replay.sft`` span (filter, counts, loss, version).

Every trace that is selected but not trained on is counted by reason in :attr:`ReplayResult.skipped`.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentforge.errors import MissingExtraError, UserError
from agentforge.ports import AdapterPublisher, TraceStore
from agentforge.trainers.progress import quiet, show_progress
from agentforge.trainers.replay.select import EmptySelectionError, Selection, TraceFilter, select_traces
from agentforge.trainers.replay.sft_config import ReplaySFTConfig
from agentforge.types import Span, SpanKind, new_id

if TYPE_CHECKING:
    from datasets import Dataset

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtraError(exc.name or "trl", "train", "replay SFT") from exc

__all__ = ["ReplayResult", "ReplaySFTTrainer", "build_examples", "run_replay_sft"]

logger = logging.getLogger("agentforge.replay")


@dataclass
class ReplayResult:
    """What one replay SFT job did.

    Attributes:
        run_id: identifies the job (on its ``replay.sft`` span and its adapter folder).
        considered: rollouts the selection looked at.
        selected: rollouts selected (reward >= threshold and every other filter).
        skipped: traces or trajectories not trained on, by reason (the selection's reasons plus
            ``no_trajectories``, ``truncated``, ``duplicate``, and ``over_max_length``: left without any
            loss token by TRL's ``max_length`` truncation).
        examples: training sequences (after TRL's ``max_length`` truncation).
        sampled_tokens: tokens with loss (the policy's own samples), summed over examples.
        steps: optimizer steps taken.
        train_loss: TRL's mean training loss over the run (nats per sampled token).
        final_loss: the last logged loss.
        adapter_dir: the saved adapter (``{output_dir}/adapters/{run_id}``).
        version: the published version (``policy@vN``), or ``None`` without a publisher.
        history: TRL's logged rows.
        wall_s: seconds from selection to publish.
    """

    run_id: str
    considered: int
    selected: int
    skipped: dict[str, int]
    examples: int
    sampled_tokens: int
    steps: int = 0
    train_loss: float | None = None
    final_loss: float | None = None
    adapter_dir: Path | None = None
    version: str | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        """JSON-ready fields (no history)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "history"}
        out["adapter_dir"] = str(self.adapter_dir) if self.adapter_dir else None
        return out


def build_examples(
    selection: Selection, *, dedupe: bool = True, skip_truncated: bool = False
) -> tuple[list[dict[str, list[int]]], Counter[str]]:
    """Pre-tokenised SFT examples from the selected traces' stored trajectories.

    Args:
        selection: the selected traces; each record's ``trajectories`` were built from engine ids.
        dedupe: keep one copy of trajectories with identical ids and mask.
        skip_truncated: drop trajectories whose call hit the completion token limit.

    Returns:
        ``(examples, skipped)``: examples ``{"input_ids": (T,), "completion_mask": (T,)}`` with
        ``T = len(prompt_ids) + len(completion_ids)`` and ``completion_mask = [0] * P + env_mask``; and
        the counts of what was dropped (``no_trajectories`` per record, ``no_sampled_tokens``,
        ``truncated`` and ``duplicate`` per trajectory).
    """
    examples: list[dict[str, list[int]]] = []
    skipped: Counter[str] = Counter()
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for record in selection.records:
        if not record.trajectories:
            skipped["no_trajectories"] += 1
            continue
        for traj in record.trajectories:
            if traj.sampled_tokens == 0:
                skipped["no_sampled_tokens"] += 1
                continue
            if skip_truncated and traj.truncated:
                skipped["truncated"] += 1
                continue
            ids = traj.ids
            mask = [0] * len(traj.prompt_ids) + list(traj.env_mask)
            key = (tuple(ids), tuple(mask))
            if dedupe and key in seen:
                skipped["duplicate"] += 1
                continue
            seen.add(key)
            examples.append({"input_ids": ids, "completion_mask": mask})
    return examples, skipped


class _History(TrainerCallback):
    """Keeps TRL's logged rows."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any
    ) -> None:
        if logs:
            row = {k: float(v) for k, v in logs.items() if isinstance(v, int | float)}
            self.rows.append({"step": float(state.global_step), **row})


def _jsonable(value: Any) -> Any:
    """The filter (or anything) as plain JSON values: mappings → dicts, enums → values, sets → lists."""

    def default(o: Any) -> Any:
        if isinstance(o, Mapping):
            return dict(o)
        if isinstance(o, Enum):
            return o.value
        if isinstance(o, set | frozenset):
            return sorted(o, key=str)
        return str(o)

    return json.loads(json.dumps(value, default=default))


class ReplaySFTTrainer:
    """Rejection-sampling SFT of a LoRA adapter on stored, successful traces (see the module docstring).

    Selection and example building happen at construction, so a filter that selects nothing fails before
    anything is loaded or written. ``.trainer`` is the underlying ``trl.SFTTrainer`` (a
    :class:`~agentforge.trainers.replay.prefix_sft.SharedPrefixSFTTrainer` with ``share_prompt_prefix``).

    Args:
        model: base checkpoint directory (the one serving loads), e.g. the prepared default model.
        store: the trace store holding the rollouts, spans and rewards.
        flt: which traces to consider; its ``min_reward`` is raised to ``config.min_reward``.
        config: :class:`ReplaySFTConfig`.
        publisher: publishes the saved adapter as a new served version; ``None`` only saves it.

    Raises:
        EmptySelectionError: no trace passes the filter, or none of the selected ones yields an example.
        UserError: a stored token id lies outside the model's vocabulary (traces of another model).
    """

    def __init__(
        self,
        model: str | Path,
        store: TraceStore,
        flt: TraceFilter | None = None,
        config: ReplaySFTConfig | None = None,
        publisher: AdapterPublisher | None = None,
    ) -> None:
        try:
            from datasets import Dataset
            from transformers import AutoTokenizer
            from trl.trainer.sft_trainer import SFTTrainer
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingExtraError(exc.name or "trl", "train", "replay SFT") from exc

        self.t0 = time.monotonic()
        self.model_path, self.store, self.publisher = str(model), store, publisher
        self.config = config or ReplaySFTConfig(output_dir="runs/replay-sft")
        flt = flt or TraceFilter()
        threshold = (
            self.config.min_reward if flt.min_reward is None else max(flt.min_reward, self.config.min_reward)
        )
        self.filter = replace(flt, min_reward=threshold, require_reward=True)
        self.run_id = new_id("replay")
        self.selection = select_traces(store, self.filter)
        examples, skipped = build_examples(
            self.selection, dedupe=self.config.dedupe, skip_truncated=self.config.skip_truncated
        )
        self.skipped: Counter[str] = Counter(self.selection.skipped) + skipped
        if not examples:  # every selected trace was dropped: report it as an empty selection
            raise EmptySelectionError(
                Selection(
                    records=[], considered=self.selection.considered, skipped=self.skipped, filter=self.filter
                )
            )
        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        vocab = len(tokenizer)
        top = max(max(e["input_ids"]) for e in examples)
        if top >= vocab:
            raise UserError(
                f"a stored token id ({top}) is outside {self.model_path}'s vocabulary of {vocab}; these traces "
                "come from another model: filter them out (e.g. TraceFilter(resources=...))"
            )
        self.examples = examples
        self._history = _History()
        trainer_cls = SFTTrainer
        if self.config.share_prompt_prefix:  # the common prompt head runs once per batch
            from agentforge.trainers.replay.prefix_sft import SharedPrefixSFTTrainer

            trainer_cls = SharedPrefixSFTTrainer
        model, peft_config = self.config.policy(self.model_path, bool(self.config.bf16))
        self.trainer = quiet(trainer_cls)(  # without the library warnings a user cannot act on
            model=model,
            args=self.config,
            train_dataset=Dataset.from_list(examples),
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=[self._history],
        )
        show_progress(self.trainer, metrics_path=self.adapter_dir / "metrics.jsonl")  # beside replay.json
        # TRL truncates to max_length and drops examples left without any loss token: count what remains.
        labels = self._train_dataset["labels"]
        if len(labels) < len(examples):
            self.skipped["over_max_length"] += len(examples) - len(labels)
        self.sampled_tokens = sum(sum(1 for t in row if t != -100) for row in labels)

    @property
    def _train_dataset(self) -> Dataset:
        """The trainer's dataset: TRL tokenized the one given into another ``datasets.Dataset``."""
        from datasets import Dataset

        dataset = self.trainer.train_dataset
        assert isinstance(dataset, Dataset)
        return dataset

    @property
    def adapter_dir(self) -> Path:
        """Where the adapter is saved: ``{output_dir}/adapters/{run_id}`` (a new folder per job)."""
        assert self.config.output_dir is not None  # TrainingArguments sets it when none is given
        return Path(self.config.output_dir) / "adapters" / self.run_id

    def train(self) -> ReplayResult:
        """Train, save the adapter, publish it (with a publisher) and record the job in the store.

        Returns:
            The :class:`ReplayResult` (counts, losses, adapter folder, published version).

        Raises:
            ServingError / AdapterIncompatibleError: publishing failed (the previous version keeps serving;
                the adapter stays saved and the job is recorded with ``version = None`` and the error).
        """
        from peft import PeftModel

        output = quiet(self.trainer.train)()
        model = self.trainer.model
        assert isinstance(model, PeftModel)  # the LoRA policy (ReplaySFTConfig.policy)
        model.save_pretrained(str(self.adapter_dir))
        losses = [row["loss"] for row in self._history.rows if "loss" in row]
        result = ReplayResult(
            run_id=self.run_id,
            considered=self.selection.considered,
            selected=len(self.selection.records),
            skipped=dict(self.skipped),
            examples=len(self._train_dataset),
            sampled_tokens=self.sampled_tokens,
            steps=int(self.trainer.state.global_step),
            train_loss=float(output.training_loss) if output.training_loss is not None else None,
            final_loss=losses[-1] if losses else None,
            adapter_dir=self.adapter_dir,
            history=list(self._history.rows),
        )
        error = None
        try:
            if self.publisher is not None:
                result.version = self.publisher.publish(self.adapter_dir, result.steps)
                logger.info("replay SFT %s: published %s", self.run_id, result.version)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            result.wall_s = time.monotonic() - self.t0
            self._record(result, error)
        return result

    def _record(self, result: ReplayResult, error: str | None) -> None:
        """Store the job as one orphan ``replay.sft`` span and write ``replay.json`` next to the adapter."""
        attributes = {
            "filter": _jsonable({f.name: getattr(self.filter, f.name) for f in fields(self.filter)})
        }
        attributes.update(_jsonable(result.summary()))
        attributes["base_model"] = self.model_path
        attributes["error"] = error
        (self.adapter_dir / "replay.json").write_text(json.dumps(attributes, indent=1))
        try:
            self.store.add_span(
                Span(
                    kind=SpanKind.custom,
                    name="replay.sft",
                    status="error" if error else "ok",
                    error=error,
                    attributes=attributes,
                )
            )
        except Exception:  # recording must not hide the trained adapter
            logger.exception("could not store the replay.sft span of %s", self.run_id)


def run_replay_sft(
    model: str | Path,
    store: TraceStore,
    flt: TraceFilter | None = None,
    config: ReplaySFTConfig | None = None,
    publisher: AdapterPublisher | None = None,
) -> ReplayResult:
    """Select successful traces, SFT a LoRA adapter on their sampled tokens, save and publish it.

    Args:
        model: base checkpoint directory (the one serving loads).
        store: the trace store.
        flt: which traces to consider (its ``min_reward`` is raised to ``config.min_reward``).
        config: :class:`ReplaySFTConfig` (default: TRL defaults, ``output_dir="runs/replay-sft"``).
        publisher: publishes the adapter as a new served version (``None``: only save it).

    Returns:
        The :class:`ReplayResult`.

    Raises:
        EmptySelectionError: nothing to train on; no adapter is written and no version published.
        UserError: stored token ids do not fit the model's vocabulary.
        ServingError / AdapterIncompatibleError: publishing failed.
    """
    return ReplaySFTTrainer(model, store, flt, config, publisher).train()
