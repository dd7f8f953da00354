"""The lightning trainer: GRPO with a LoRA adapter through TRL, fed by rollouts the agents really ran.

Loop (one optimizer step):

1. TRL's sampler yields ``tasks_per_step`` task ids, each repeated ``G`` times.
2. :class:`~agentforge.trainers.rollouts.RolloutSource` (TRL's ``rollout_func``) enqueues one rollout per
   entry pinned to the version serving now, waits for runners (any process) to finish them through the
   gateway, and returns token-exact samples built from the stored spans, with the stored rewards.
3. ``trl.GRPOTrainer`` computes group-relative advantages (Shao et al. 2024, "DeepSeekMath", GRPO) and
   takes one step on the LoRA adapter (``peft``). The engine's stored logprobs feed TRL's importance
   sampling correction for the train/serve mismatch (TRL ``vllm_importance_sampling_correction``); each
   span is recomputed at the temperature its stored logprobs were computed at (:mod:`.engine_logps`).
4. Every ``swap_every`` steps the adapter is saved (with the optimizer state, :mod:`.lineage`), published as a
   new version in the store and hot-swapped into serving (canary first) by the :class:`AdapterPublisher`.

Publishing goes through TRL's documented hook, a ``transformers.TrainerCallback`` (:mod:`.step_callbacks`):
at the beginning of every optimizer step that samples fresh rollouts (every step unless
``num_iterations`` > 1), after the previous step's update, which is where TRL would sync its own vLLM. The step's logged row therefore names
the version that produced its samples. The one piece TRL offers no public way to do, importance
sampling against an engine TRL did not start, is in :mod:`agentforge.trainers.trl_private`, guarded by
the tested TRL version.

**Sample sources.** Anything that follows :class:`~agentforge.ports.SampleSource` can feed the
trainer: :class:`RolloutSource` (live rollouts, the default), ``StoredGroupSource`` (offline GRPO on groups
already in the store, :mod:`agentforge.trainers.replay.grpo`), the continual trainer's feedback source.

**Metrics** (each logged step; in the store as ``trainer.metrics`` spans, in ``{output_dir}/metrics.jsonl``,
and in TRL's logs, so any ``report_to`` integration, e.g. TensorBoard, records them; the console shows one
line per step, :mod:`agentforge.trainers.progress`):

* TRL's own: ``loss``, ``reward`` / ``reward_std``, ``frac_reward_zero_std``, ``completions/clipped_ratio``
  (completions cut at the length limit), ``clip_ratio/*`` (PPO-clipped token share), ``entropy`` (the policy's
  mean per-token entropy over the trained tokens, nats), ``sampling/importance_sampling_ratio/{min,mean,max}``
  (the train/serve ratio after TRL's cap), and ``kl`` — TRL computes the KL to the reference policy only
  when ``beta > 0`` (its default is 0, no reference pass), so ``kl`` is present exactly then;
* the raw train/serve ratio ``exp(trainer − engine)`` per sampled token, before any cap
  (:mod:`.engine_logps`): ``sampling/raw_importance_ratio/{mean,min,p01,p99,max}`` and ``/outside_share``
  (the share of tokens whose ratio is outside [0.5, 2]);
* the step's size (:mod:`.diagnostics`): ``train/update_norm`` (``‖Δθ‖₂`` over the LoRA parameters) and
  ``train/update_ratio`` (``‖Δθ‖₂ / ‖θ‖₂``, θ before the step; 0 when nothing moved);
* ``batch/signal_group_share``: groups with some non-zero advantage ÷ groups trained (from TRL's advantages,
  :class:`~agentforge.trainers.lightning_grpo.LearningSignal`);
* the batch report: ``batch/reward_mean``, ``batch/reward_std``, ``batch/zero_variance_share`` (groups whose
  rewards are all equal), ``batch/truncated_share``, ``batch/sampled_tokens``, ``batch/forced_token_share``
  (sampled tokens a grammar forced, trained with loss mask 0: :mod:`.samples`), ``batch/wait_s``,
  ``batch/skipped_<reason>``, ``batch/extra_trajectories`` and ``batch/split_share`` (conversations that
  split: only their last piece trains; the step line warns);
* ``train/step_s`` (wall time of the optimizer step, rollout wait and publish included, seconds),
  ``train/tokens_per_s`` (sampled tokens trained in the step ÷ ``train/step_s``), ``policy/version`` (the
  served version's number; the history row and the span also carry the name, ``version``),
  ``publish/skipped_no_signal`` (publishes skipped so far because no batch since the last version had a non-zero
  advantage: all its groups' rewards were equal, so the adapter got no gradient and no version was published).

**Several processes** (``accelerate launch``, see ``docs/multi_gpu.md``): TRL calls the ``rollout_func`` on
every rank with that rank's prompts. Here the ranks gather their prompts to the main process, which alone
calls the source (enqueues rollouts, reads the store) and broadcasts the samples; each rank keeps its own
slice. Only the main process saves, publishes and hot-swaps adapters and writes metrics.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentforge.errors import ConfigError, MissingExtraError, NotFoundError, RunError, UserError
from agentforge.ports import AdapterPublisher, BatchReport, SampleSource, TraceStore
from agentforge.trainers.checkpoints import ResumeReport, resume_checkpoint
from agentforge.trainers.diagnostics import UpdateSize
from agentforge.trainers.grpo_config import TrainConfig, part_credit_problems
from agentforge.trainers.lineage import save_optimizer_state
from agentforge.trainers.part_credit import ROLE_COLUMN, parse_parts, part_reward_funcs
from agentforge.trainers.progress import quiet, show_progress, write_metrics_row
from agentforge.trainers.rollouts import RolloutSource, stored_reward
from agentforge.trainers.samples import TEMPERATURE_COLUMN
from agentforge.trainers.step_callbacks import MetricsCallback, PublishCallback
from agentforge.trainers.trl_private import log_step_metrics, use_engine_logprobs
from agentforge.types import Span, SpanKind, Task, parse_version_number

__all__ = ["LightningTrainer"]

logger = logging.getLogger("agentforge.trainer")


class LightningTrainer:
    """GRPO + LoRA on rollouts executed by external runners, with hot-swapped adapter versions.

    Args:
        model: base checkpoint directory (the one serving loads), e.g. the prepared default model.
        store: the trace store shared with the gateway and the runners.
        tasks: training tasks; each step samples ``config.tasks_per_step`` of them. Ignored (may be
            ``None``) when ``source`` is given.
        config: :class:`TrainConfig` (TRL's ``GRPOConfig`` + agentforge fields).
        publisher: publishes each saved adapter as a new served version.
        source: where samples come from (:class:`~agentforge.ports.SampleSource`); default a
            :class:`RolloutSource` that has runners execute ``tasks``.
        swap_during_training: publish every ``swap_every`` steps (default); ``False`` publishes only once,
            at the end of :meth:`train` (offline training, where nothing samples from serving meanwhile).

    Raises:
        UserError: neither ``tasks`` nor ``source`` given, or the source has fewer groups than one step needs.

    Attributes:
        history: one dict of metrics per logged step (also written to the store as ``trainer.metrics``
            spans, orphans with ``attributes.run_id``).
        versions: the versions published by this run, in order.
    """

    def __init__(
        self,
        model: str | Path,
        store: TraceStore,
        tasks: Sequence[Task] | None,
        config: TrainConfig,
        publisher: AdapterPublisher,
        *,
        source: SampleSource | None = None,
        swap_during_training: bool = True,
    ) -> None:
        try:
            from datasets import Dataset
            from transformers import AutoTokenizer

            from agentforge.trainers.lightning_grpo import lightning_trainer_class
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingExtraError(exc.name or "trl", "train", "the lightning trainer") from exc

        self.model_path, self.store, self.config, self.publisher = str(model), store, config, publisher
        self.tasks = {t.task_id: t for t in tasks or ()}
        self.history: list[dict[str, Any]] = []
        self.versions: list[str] = []
        self._published_step = -1
        self._signal_at_publish = 0  # the trainer's ``signal_batches`` when the served adapter was published
        self.skipped_publishes = 0
        self._resuming = False
        self.swap_during_training = swap_during_training
        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.placeholder_token_id = int(tokenizer.eos_token_id or 0)
        if source is None:
            if not self.tasks:
                raise UserError("LightningTrainer needs tasks (for runners to execute) or a sample source")
            if config.rollout_version == "trained" and not hasattr(publisher, "stage"):
                raise ConfigError(
                    f"rollout_version='trained' needs a publisher that stages adapters for the trainer's rollouts "
                    f"(GatedPublisher); {type(publisher).__name__} has no stage()"
                )
            source = RolloutSource(
                store,
                self.tasks,
                config.num_generations,
                self.sampling_version,
                alias=config.alias,
                placeholder_token_id=self.placeholder_token_id,
                agent=config.agent_name,
                timeout_s=config.rollout_timeout_s,
                max_attempts=config.rollout_max_attempts,
                wait_timeout_s=config.wait_timeout_s,
                max_staleness=config.max_staleness,
                extra_tasks=config.extra_tasks_per_step,
                seed=config.seed,
                explored=config.explored_samples == "train",
                trajectories_per_rollout=config.trajectories_per_rollout,
            )
        self.source = source
        prompts = source.prompts()
        if len(prompts) < config.tasks_per_step:
            raise UserError(
                f"the sample source has {len(prompts)} groups but one step needs tasks_per_step="
                f"{config.tasks_per_step}; lower tasks_per_step or provide more groups"
            )
        dataset = Dataset.from_list([{"prompt": p} for p in prompts])
        trainer_cls = lightning_trainer_class(bool(getattr(config, "share_prompt_prefix", True)))
        policy, peft_config = self._policy(config)
        self.trainer = quiet(trainer_cls)(  # without the library warnings a user cannot act on
            model=policy,
            reward_funcs=_reward_funcs(config),
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=peft_config,
            rollout_func=self._rollouts,
            callbacks=[MetricsCallback(self), PublishCallback(self), UpdateSize(self)],  # step_s has publish
        )
        self.source.run_id = self._stable_run_id()
        use_engine_logprobs(self.trainer)  # TRL's importance-sampling correction against the served engine
        show_progress(self.trainer, version=publisher.current)  # one console line per step, not TRL's dicts

    def _policy(self, config: TrainConfig) -> tuple[Any, Any]:
        """TRL's ``model`` and ``peft_config``: the base path and a fresh LoRA, or a trainable PEFT model that
        continues ``config.init_adapter`` (its optimizer state too, :mod:`~agentforge.trainers.lineage`).

        The KL reference (``beta > 0`` only) differs: for a fresh LoRA TRL disables the adapter (the base
        model); for a continued one TRL 1.16 (``GRPOTrainer.__init__``, branch ``elif is_peft_model(model) and
        args.beta != 0.0``) adds a frozen copy of it as the adapter ``"ref"`` and computes the reference
        log-probs under ``use_adapter(model, "ref")`` (``_generate_and_score_completions``): the anchor is the
        continued adapter as this run loaded it, not the base. (``save_pretrained`` then also writes that copy,
        in the published folder's ``ref/``.)
        """
        return config.policy(self.model_path, bool(config.bf16))

    @property
    def is_main_process(self) -> bool:
        """Whether this is the process that talks to the store and serving (always true on one process)."""
        return bool(self.trainer.accelerator.is_main_process)

    def _rollouts(self, prompts: Sequence[Any], trainer: Any = None) -> dict[str, list[Any]]:
        """TRL's ``rollout_func``: the source runs on the main process only; each rank gets its slice."""
        out = self._rank_samples(prompts, trainer)
        self.trainer.set_sample_temperatures(out.pop(TEMPERATURE_COLUMN, None))  # engine_logps: per token
        self.trainer.set_token_roles(out.pop(ROLE_COLUMN, None))  # part_credit: per token
        return out

    def _rank_samples(self, prompts: Sequence[Any], trainer: Any = None) -> dict[str, list[Any]]:
        accelerator = self.trainer.accelerator
        if accelerator.num_processes == 1:
            return self.source(prompts, trainer)
        from accelerate.utils import broadcast_object_list, gather_object

        everything = gather_object([list(prompts)])  # one list per rank, in rank order
        box: list[Any] = [None]
        if accelerator.is_main_process:
            try:
                box[0] = self.source([p for part in everything for p in part], trainer)
            except Exception as exc:  # tell the other ranks instead of leaving them waiting forever
                box[0] = exc
        broadcast_object_list(box, from_process=0)
        if isinstance(box[0], BaseException):
            if accelerator.is_main_process:
                raise box[0]
            raise RunError(f"the main process's sample source failed: {box[0]!r}")
        lo = sum(len(part) for part in everything[: accelerator.process_index])
        return {key: values[lo : lo + len(prompts)] for key, values in box[0].items()}

    def _stable_run_id(self) -> str:
        """The run id, kept in ``{output_dir}/agentforge-run.json`` so a resumed run keeps its identity."""
        path = Path(self._output_dir) / "agentforge-run.json"
        if path.exists():
            return str(json.loads(path.read_text())["run_id"])
        if not self.is_main_process:  # only the main process's identity is ever written anywhere
            return self.source.run_id
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"run_id": self.source.run_id}))
        return self.source.run_id

    @property
    def run_id(self) -> str:
        """Identifies this run on its rollouts (``metadata.trainer_run``) and metric spans."""
        return self.source.run_id

    @property
    def _output_dir(self) -> str:
        """``config.output_dir``, which ``TrainingArguments`` sets (``trainer_output``) when none is given."""
        output_dir = self.config.output_dir
        assert output_dir is not None
        return output_dir

    @property
    def adapter_dir(self) -> Path:
        """Where published adapters are saved (``{output_dir}/adapters/step-N``)."""
        return Path(self._output_dir) / "adapters"

    def train(self, resume_from_checkpoint: bool | str | None = None) -> dict[str, Any]:
        """Run ``config.max_steps`` optimizer steps, publishing every ``swap_every`` and at the end.

        Args:
            resume_from_checkpoint: ``True`` resumes from the last checkpoint in ``output_dir``
                (after a crash or ``kill -9``; a fresh start when there is none); a path resumes from that
                checkpoint. The source's store cursor continues too (rollouts formed for a step before the
                restart are trained by that step, :mod:`~agentforge.trainers.rollouts`), and the next adapter
                is published as the next version number. A checkpoint that lacks optimizer, scheduler or
                random state (``save_only_model=True``) resumes with a warning naming each missing part
                (:mod:`~agentforge.trainers.checkpoints`).

        Returns:
            ``{"steps", "versions", "history", "resume", "skipped_publishes"}``; ``resume`` is ``None`` for a
            fresh start, else ``{"checkpoint", "missing"}`` (``missing``: one sentence per part the checkpoint
            lacks); ``skipped_publishes`` counts publishes skipped for lack of learning signal.

        Raises:
            UserError: the checkpoint folder cannot be resumed (no weights, no ``trainer_state.json``).
            RolloutTimeout: no runner finished any rollout of a batch within ``wait_timeout_s``.
            ServingError / AdapterIncompatibleError: publishing an adapter failed (the previous version
                keeps serving).
        """
        resume = None
        if resume_from_checkpoint:  # None: nothing to resume yet (a fresh start)
            resume = resume_checkpoint(self._output_dir, resume_from_checkpoint)
        if resume is not None:
            self._report_resume(resume)
            restore = getattr(self.publisher, "restore", None)
            if restore is not None:
                restore()  # serve the store's latest version again before sampling
        self._resuming = resume is not None
        quiet(self.trainer.train)(resume_from_checkpoint=resume.checkpoint if resume else None)
        quiet(self.maybe_publish)(force=True)  # as the publishes during training: same filters
        unstage = getattr(self.publisher, "unstage", None)
        if unstage is not None and self.is_main_process:
            unstage()  # the staged adapter served only this run's rollouts
        return {
            "steps": self.trainer.state.global_step,
            "versions": list(self.versions),
            "history": self.history,
            "resume": resume and {"checkpoint": resume.checkpoint, "missing": resume.missing},
            "skipped_publishes": self.skipped_publishes,
        }

    def _report_resume(self, resume: ResumeReport) -> None:
        """Say what a resume starts from: a warning (and a ``trainer.resume`` span) for each missing part."""
        if not resume.complete:
            logger.warning(
                "resuming from %s, which is not a full checkpoint; it lacks: %s. Training continues from its "
                "adapter weights and step counter, but this is not a true continuation of the interrupted run",
                resume.checkpoint,
                "; ".join(resume.missing),
            )
        if self.is_main_process:
            attributes = {"run_id": self.run_id, "checkpoint": resume.checkpoint, "missing": resume.missing}
            try:
                self.store.add_span(Span(kind=SpanKind.custom, name="trainer.resume", attributes=attributes))
            except Exception:  # a record, never a reason to stop
                logger.exception("could not store the resume record of %s", resume.checkpoint)

    def sampling_version(self) -> str:
        """The version this run's rollouts pin (``config.rollout_version``): the staged newest adapter, or the
        served version."""
        if self.config.rollout_version == "trained":
            return str(self.publisher.sampling_version())  # type: ignore[attr-defined]
        return self.publisher.current()

    def maybe_stage(self) -> str | None:
        """With ``rollout_version="trained"``: stage the adapter the last optimizer step produced, so the next
        batch samples it (``publisher.stage``), unless the version serving by default is that adapter already.

        Returns:
            The staged version, or ``None`` when nothing was staged.
        """
        step = int(self.trainer.state.global_step)
        if self.config.rollout_version != "trained" or not self.is_main_process or step == 0:
            return None
        if step == self._published_step and self.versions and self.publisher.current() == self.versions[-1]:
            return None  # promoted just now: the alias serves this step's adapter
        path = self.adapter_dir / f"step-{step}"
        if not (path / "adapter_config.json").is_file():
            self.trainer.model.save_pretrained(path)
        version = self.publisher.stage(path, step)  # type: ignore[attr-defined]
        logger.info("step %d: staged %s for the next batch's rollouts", step, version)
        return str(version)

    def maybe_publish(self, force: bool = False) -> str | None:
        """Save and publish the adapter if ``swap_every`` steps passed since the last publish (or ``force``).

        Only the main process publishes; on the other ranks this returns ``None`` and touches nothing. A publish
        is skipped (logged, counted in ``skipped_publishes`` and the ``publish/skipped_no_signal`` metric) when no
        generation batch since the last published version had a non-zero advantage, unless
        ``config.publish_without_signal``: the adapter got no gradient, so a new version would serve nothing new.

        Returns:
            The new version, or ``None`` when nothing was published.
        """
        if not self.is_main_process:
            return None
        step = int(self.trainer.state.global_step)
        if self._resuming:  # first sync after a resume: skip if the checkpoint's adapter already serves
            self._resuming = False
            self._signal_at_publish = -1  # the checkpoint's weights may have learned before the restart
            if self._served_step() >= step:
                self._published_step = step
        if step == 0 or step == self._published_step:
            return None
        if not force and (not self.swap_during_training or step % self.config.swap_every):
            return None
        signal = int(getattr(self.trainer, "signal_batches", 0))
        if signal == self._signal_at_publish and not self.config.publish_without_signal:
            self._published_step = step  # nothing new to serve: the next publish needs a batch with signal
            self.skipped_publishes += 1
            logger.warning(
                "step %d: not publishing a new %s version: no batch since the last published version had a "
                "non-zero advantage (every group's rewards were equal), so the adapter got no gradient; %s keeps "
                "serving (publish_without_signal=True publishes anyway)",
                step,
                self.config.alias,
                self.publisher.current(),
            )
            return None
        path = self.adapter_dir / f"step-{step}"
        self.trainer.model.save_pretrained(path)
        lineage_steps = self.trainer.lineage_steps + step  # the next round continues from here (lineage.py)
        save_optimizer_state(self.trainer.optimizer, self.trainer.model, path, lineage_steps)
        version = self.publisher.publish(path, step)
        self._published_step, self._signal_at_publish = step, signal
        self.versions.append(version)
        logger.info("step %d: published %s", step, version)
        return version

    def _served_step(self) -> int:
        """The training step of the adapter version the store has active (-1 if none)."""
        try:
            return int(self.store.get_resource(self.config.alias).payload.get("step", -1))
        except NotFoundError:  # nothing published yet
            return -1

    def step_metrics(self, step_s: float, reports: Sequence[BatchReport]) -> dict[str, float]:
        """Add one optimizer step's agentforge metrics to TRL's (averaged over the logging window by TRL).

        Args:
            step_s: wall time of the step, seconds (rollout wait and publish included).
            reports: the batch reports produced during the step (empty on non-main ranks).

        Returns:
            The metrics added: the last report's ``batch/*``, ``train/step_s``, ``train/tokens_per_s``
            (sampled tokens trained ÷ ``step_s``) and ``policy/version``.
        """
        if not self.is_main_process:
            return {}
        out: dict[str, float] = {"train/step_s": step_s}
        if reports:
            out.update(reports[-1].metrics())
            out["train/tokens_per_s"] = sum(r.sampled_tokens for r in reports) / max(step_s, 1e-9)
        out["policy/version"] = float(parse_version_number(self.publisher.current(), default=0))
        out["publish/skipped_no_signal"] = float(self.skipped_publishes)
        log_step_metrics(self.trainer, out)
        return out

    def record_metrics(self, step: int, logs: dict[str, float]) -> None:
        """Append one history row (TRL's logs, which include :meth:`step_metrics`, + the served version's
        name) and write it to the store as a ``trainer.metrics`` span and to ``metrics.jsonl``.

        Main process only; metrics never stop training (a store error is logged).
        """
        if not self.is_main_process:
            return
        row: dict[str, Any] = {"step": step, "version": self.publisher.current()}
        row.update({k: float(v) for k, v in logs.items() if isinstance(v, int | float)})
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
        write_metrics_row(Path(self._output_dir) / "metrics.jsonl", clean)


def _reward_funcs(config: TrainConfig) -> list[Any]:
    """TRL's reward functions: the stored reward, and with ``part_credit`` the two role rewards at weight 0
    (``config.reward_weights`` is set to ``[1, 0, 0]``; :mod:`agentforge.trainers.part_credit`).

    Raises:
        ConfigError: bad ``call_parts``/``reply_parts``, or ``reward_weights`` set to anything else.
    """
    if not config.part_credit:
        return [stored_reward]
    problems = part_credit_problems(config)  # the fields may have been set after the config was built
    if problems:
        raise ConfigError("invalid TrainConfig: " + "; ".join(problems))
    config.reward_weights = [1.0, 0.0, 0.0]
    call, reply = parse_parts(config.call_parts, "call_parts"), parse_parts(config.reply_parts, "reply_parts")
    return [stored_reward, *part_reward_funcs(call, reply)]
