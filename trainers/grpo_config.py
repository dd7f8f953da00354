"""``TrainConfig``: TRL's ``GRPOConfig`` plus the fields agentforge adds, validated when built.

Defaults follow the written policy (STYLE 6): paper/TRL values for hyper-parameters; the one obvious dial
is ``num_generations`` (the GRPO group size G). Fields added here only concern the decoupled loop:
rollouts are executed by runners through the gateway, adapters are hot-swapped every ``swap_every``
optimizer steps, and samples older than ``max_staleness`` versions are dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agentforge.errors import ConfigError, MissingExtraError
from agentforge.trainers.lora import LoraFields
from agentforge.trainers.micro_batches import micro_batches
from agentforge.trainers.part_credit import parse_parts
from agentforge.trainers.progress import adopt_activation_checkpointing

try:
    from trl.trainer.grpo_config import GRPOConfig
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtraError("trl", "train", "the lightning trainer") from exc

__all__ = ["TrainConfig", "train_on_cpu_without_an_accelerator"]


def train_on_cpu_without_an_accelerator(config: GRPOConfig) -> None:
    """Left unset (``bf16=None``, ``use_cpu=False``) on a machine with no CUDA, XPU or MPS device: train on the CPU
    in float32 (``use_cpu=True``, ``bf16=False``) instead of TRL's bf16 default, which transformers refuses there
    ("Your setup doesn't support bf16/gpu"). Set either field to choose yourself (bf16 on a CPU with AMX or
    AVX-512-BF16: ``use_cpu=True, bf16=True``)."""
    if config.bf16 is not None or config.use_cpu:
        return
    import torch

    accelerated = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    if not (accelerated or torch.backends.mps.is_available()):
        config.use_cpu, config.bf16 = True, False


@dataclass
class TrainConfig(LoraFields, GRPOConfig):
    """GRPO hyper-parameters (TRL) plus the decoupled-loop settings of agentforge.

    Attributes:
        tasks_per_step: distinct tasks per optimizer step (per process); each runs ``num_generations``
            rollouts, sampled as one batch. ``gradient_accumulation_steps`` splits that batch into equal
            micro-batches (a memory knob: the update is the same, issue 15): ``per_device_train_batch_size
            = tasks_per_step × num_generations / gradient_accumulation_steps``, derived, overriding any
            value passed. ``steps_per_generation`` equals the accumulation (set anything else: an error);
            TRL's ``bnpo`` loss, whose normaliser is local to a micro-batch, is refused (use ``dapo``).
        max_rows_per_micro_batch: the memory knob: the most rows (rollouts' trajectories) one forward + backward
            holds. The accumulation is raised to the smallest divisor ``a`` of the step's rows (at least the
            ``gradient_accumulation_steps`` given) with ``rows / a <= max_rows_per_micro_batch``, so the update is
            unchanged (it is invariant to the split) and the update's peak memory grows with this × the
            sequence length (prompt + completion tokens), not with ``tasks_per_step × num_generations``. Measured
            on SmolLM2-135M (1,300 prompt + 100 completion tokens, bf16, CPU): ``benchmarks/update_memory.py``.
            0: no cap (the accumulation given, by default every row of the step in one micro-batch).
        logprob_chunk_tokens: the LM head of every log-probability pass projects at most this many tokens per
            call of TRL's fused kernel (:mod:`agentforge.trainers.logp_memory`): its transient (about 1 GB per
            800 tokens on a 49k vocabulary on CPU, capped near 5 GB by TRL's 4,096-token tile) stays bounded;
            same values and gradients. 0: TRL's call as is. Applies with ``share_prompt_prefix``.
        extra_tasks_per_step: dynamic sampling (DAPO, Yu et al. 2025): tasks sampled per step beyond
            ``tasks_per_step`` (each a group of ``num_generations`` rollouts); the step trains on
            ``tasks_per_step`` of the groups, those whose rewards differ first (:mod:`.rollouts`). 0 = off.
        trajectories_per_rollout: rows each rollout fills (``k``, default 1): for agents whose rollout holds
            ``k`` conversations by design (parallel LangGraph branches, each its own chat), its last ``k``
            trajectories each train with the rollout's reward; with 1, a rollout that split trains its last
            trajectory only. ``num_generations`` counts rows: a group is ``num_generations / k`` rollouts
            (:mod:`.rollouts`).
        explored_samples: ``"exclude"`` (default) or ``"train"``: whether a rollout whose tokens were sampled at a
            temperature other than 1 by an engine returning raw logprobs (a guided call's recomputed logprobs
            always are) trains, as a sample of the temperature-1 policy, or is excluded as unmatched
            (:mod:`.logprob_match`, "explored samples"). For agents that explore their tool decision at T > 1.
        rollout_version: which version a batch's rollouts pin. ``"served"`` (default): the version serving by
            default (the rollouts are on-policy only while every published adapter is promoted); ``"trained"``:
            the newest trained adapter, staged after every optimizer step for the trainer's own rollouts and
            never served by default (``publisher.stage``, e.g. :class:`~agentforge.serving.promoter.
            GatedPublisher`): GRPO stays on-policy whatever the promotion gate decides. For trainers that
            sample tasks, not live traffic.
        negative_advantage_scale: multiplies every negative advantage (default 1: GRPO as published). Below 1
            the samples worse than their group's mean are pushed down less than the better ones are pushed up:
            0 keeps only the positive half (a reward-weighted form of rejection-sampling fine-tuning, RAFT:
            Dong et al. 2023; Xiong et al. 2025, "A Minimalist Approach to LLM Reasoning", arXiv 2504.11343,
            found the positive samples carry most of GRPO's pass@1 gain). Must be >= 0.
        success_bonus: added to the advantage of every sample whose reward is at least ``success_reward``
            (default 0: GRPO as published). A supervised term inside the RL update: with the importance ratio
            at 1 the policy gradient of ``A + b`` is GRPO's plus ``b`` × the log-likelihood gradient of the
            successes (rejection-sampling SFT), so groups in which every sample succeeded, which GRPO gives
            no gradient, anchor what the policy already does (PPO-ptx, Ouyang et al. 2022; CHORD, Zhang et al.
            2025, arXiv 2508.11408). Must be >= 0.
        success_reward: the reward at or above which a sample counts as a success for ``success_bonus``.
        part_credit: credit by reward part and by span (:mod:`agentforge.trainers.part_credit`; MT-GRPO, Zeng
            et al. 2025, arXiv 2505.11821): the tokens of a span that made tool calls get the group-relative
            advantage of the mean of ``call_parts``, a later reply's tokens that of ``reply_parts``, every other
            token the whole reward's (GRPO). Reads the reward's ``metadata["parts"]``; rows without them train
            as GRPO. Default ``False`` (GRPO as published). Not with ``reward_weights`` set.
        call_parts / reply_parts: the reward parts of the call and reply roles, joined by ``+``
            (defaults ``"tool+arguments"`` and ``"reply"``: the tool-turn rewards' parts).
        swap_every: publish and hot-swap the adapter every this many optimizer steps (k).
        max_staleness: samples produced by a version more than this many versions behind the
            current one are dropped (masked and counted), never trained on.
        alias: the model alias the agents call (``policy``).
        agent_name: only runners serving this agent name pick the trainer's rollouts (empty: any).
        rollout_timeout_s: per-attempt limit given to each enqueued rollout, seconds.
        wait_timeout_s: how long one step waits for its rollouts to finish, seconds.
        rollout_max_attempts: attempts per rollout (first try + retries).
        lora_r / lora_alpha / lora_dropout / lora_target_modules: the ``peft.LoraConfig``, the field set
            every trainer config shares (:class:`~agentforge.trainers.lora.LoraFields`); rank must not
            exceed the server's ``--max-lora-rank``.
        publish_without_signal: publish (and hot-swap) an adapter even when no optimizer step since the last
            published version had a non-zero advantage (every group's rewards were equal, so the adapter got
            no gradient). ``False`` (default) skips such a publish, logs why and counts it
            (``publish/skipped_no_signal``).
        share_prompt_prefix: compute log-probabilities with one prompt pass per group and the KV cache
            repeated over its ``G`` completions (:mod:`agentforge.trainers.prefix`); same values and
            gradients as TRL's per-row pass up to rounding. ``False`` uses TRL's own pass. Under
            ``gradient_checkpointing`` (TRL's default) only the no-grad passes share, since checkpointed
            layers drop KV caches; set ``gradient_checkpointing=False`` for the full speed-up.
    """

    # TRL's own field, typed int | None there although TRL's checks need a number: here it is one
    num_generations: int = field(default=8, metadata={"help": "Rollouts per task (the GRPO group, >= 2)."})
    tasks_per_step: int = field(default=4, metadata={"help": "Distinct tasks per optimizer step."})
    extra_tasks_per_step: int = field(
        default=0,
        metadata={"help": "Dynamic sampling: extra tasks sampled per step, groups with signal trained."},
    )
    trajectories_per_rollout: int = field(
        default=1,
        metadata={
            "help": "Rows per rollout: its last k trajectories (parallel branches); divides num_generations."
        },
    )
    explored_samples: str = field(
        default="exclude",
        metadata={"help": "'train': raw-logprob spans sampled at T != 1 train as T=1 samples (explored)."},
    )
    rollout_version: str = field(
        default="served",
        metadata={"help": "Pin rollouts to the served version or the newest trained (staged) adapter."},
    )
    negative_advantage_scale: float = field(
        default=1.0,
        metadata={"help": "Multiply negative advantages by this (0 = positive half only, 1 = GRPO)."},
    )
    success_bonus: float = field(
        default=0.0,
        metadata={"help": "Add this to the advantage of every sample rewarded >= success_reward (0 = GRPO)."},
    )
    success_reward: float = field(
        default=1.0, metadata={"help": "The reward at or above which a sample counts for success_bonus."}
    )
    part_credit: bool = field(
        default=False,
        metadata={
            "help": "Credit by reward part: call tokens get call_parts' advantage, reply tokens reply_parts'."
        },
    )
    call_parts: str = field(
        default="tool+arguments", metadata={"help": "Reward parts of a tool call's tokens."}
    )
    reply_parts: str = field(default="reply", metadata={"help": "Reward parts of a later reply's tokens."})
    swap_every: int = field(default=1, metadata={"help": "Hot-swap the adapter every k optimizer steps."})
    max_staleness: int = field(default=1, metadata={"help": "Drop samples more than this many versions old."})
    alias: str = field(default="policy", metadata={"help": "Model alias the agents call."})
    agent_name: str = field(default="", metadata={"help": "Agent name on the enqueued rollouts."})
    rollout_timeout_s: float = field(default=300.0, metadata={"help": "Per-attempt rollout time limit (s)."})
    wait_timeout_s: float = field(default=1800.0, metadata={"help": "Max wait for a step's rollouts (s)."})
    rollout_max_attempts: int = field(default=2, metadata={"help": "Attempts per rollout."})
    publish_without_signal: bool = field(
        default=False,
        metadata={
            "help": "Publish an adapter even when no step since the last version had a non-zero advantage."
        },
    )
    share_prompt_prefix: bool = field(
        default=True,
        metadata={"help": "Run each group's prompt once per log-prob pass (shared-prefix forward)."},
    )
    max_rows_per_micro_batch: int = field(
        default=8,
        metadata={
            "help": "Most rows per forward/backward; raises the accumulation (same update). 0: no cap."
        },
    )
    logprob_chunk_tokens: int = field(
        default=512,
        metadata={"help": "Tokens per LM-head call in the log-prob passes (bounded memory). 0: TRL's call."},
    )

    def __post_init__(self) -> None:
        # One optimizer step trains on exactly one generation batch of ``tasks_per_step`` groups per process;
        # gradient accumulation splits that batch into micro-batches, it never adds groups to the step.
        problems = _split_problems(self)
        if problems:  # before TRL's own checks, which would report the overridden values instead
            raise ConfigError("invalid TrainConfig: " + "; ".join(problems))
        rows = self.tasks_per_step * self.num_generations
        self.gradient_accumulation_steps = micro_batches(
            rows, self.gradient_accumulation_steps, self.max_rows_per_micro_batch
        )
        self.per_device_train_batch_size = max(1, rows // max(1, self.gradient_accumulation_steps))
        self.steps_per_generation = self.gradient_accumulation_steps
        adopt_activation_checkpointing(self)  # TRL's default under transformers' new name: no FutureWarning
        train_on_cpu_without_an_accelerator(self)
        super().__post_init__()
        if self.num_generations < 2:
            problems.append(f"num_generations={self.num_generations} (GRPO needs a group of at least 2)")
        if self.tasks_per_step < 1:
            problems.append(f"tasks_per_step={self.tasks_per_step} (must be >= 1)")
        k = self.trajectories_per_rollout
        if k < 1 or self.num_generations % k or self.num_generations // k < 2:
            problems.append(
                f"trajectories_per_rollout={k} must be >= 1 and divide num_generations={self.num_generations} "
                f"into groups of at least 2 rollouts"
            )
        if self.explored_samples not in ("exclude", "train"):
            problems.append(f"explored_samples={self.explored_samples!r} (use 'exclude' or 'train')")
        if self.extra_tasks_per_step < 0:
            problems.append(f"extra_tasks_per_step={self.extra_tasks_per_step} (must be >= 0)")
        if self.rollout_version not in ("served", "trained"):
            problems.append(f"rollout_version={self.rollout_version!r} (must be 'served' or 'trained')")
        if not self.negative_advantage_scale >= 0:  # NaN too
            problems.append(f"negative_advantage_scale={self.negative_advantage_scale} (must be >= 0)")
        if not self.success_bonus >= 0:  # NaN too
            problems.append(f"success_bonus={self.success_bonus} (must be >= 0)")
        if not math.isfinite(self.success_reward):
            problems.append(f"success_reward={self.success_reward} (must be a finite number)")
        if self.part_credit:
            problems += part_credit_problems(self)
        if self.swap_every < 1:
            problems.append(f"swap_every={self.swap_every} (must be >= 1)")
        if self.max_staleness < 0:
            problems.append(f"max_staleness={self.max_staleness} (must be >= 0)")
        problems += self.lora_problems()
        if self.rollout_timeout_s <= 0 or self.wait_timeout_s <= 0:
            problems.append(
                f"timeouts must be > 0 (rollout {self.rollout_timeout_s}s, wait {self.wait_timeout_s}s)"
            )
        if problems:
            raise ConfigError("invalid TrainConfig: " + "; ".join(problems))


#: TRL loss types whose normaliser is local to a micro-batch, so the update changes with the split.
SPLIT_DEPENDENT_LOSSES = {"bnpo": "dapo (the same token mean, over the whole step's batch)"}


def _split_problems(config: TrainConfig) -> list[str]:
    """What makes the update depend on how a step's batch is split (issue 15, item 1), before TRL sees it.

    Checked: ``gradient_accumulation_steps`` divides the step's ``tasks_per_step × num_generations`` rows;
    ``steps_per_generation`` / ``generation_batch_size`` are not set to something else (agentforge samples
    one batch per optimizer step, and the publish callback and TRL's normalisers count on it); the loss type
    normalises over the whole step (not TRL's micro-batch-local ``bnpo``); ``vespo`` gets the token-level
    importance-sampling mode TRL requires (TRL checks it only for a vLLM it starts itself, and
    :func:`~agentforge.trainers.trl_private.use_engine_logprobs` turns the correction on after that check).
    """
    problems = []
    rows, accumulation = config.tasks_per_step * config.num_generations, config.gradient_accumulation_steps
    if accumulation < 1 or rows % accumulation:
        problems.append(
            f"gradient_accumulation_steps={accumulation} must divide the step's tasks_per_step × "
            f"num_generations = {rows} rows (each micro-batch holds rows / gradient_accumulation_steps)"
        )
    if config.max_rows_per_micro_batch < 0 or config.logprob_chunk_tokens < 0:
        problems.append(
            f"max_rows_per_micro_batch={config.max_rows_per_micro_batch} / logprob_chunk_tokens="
            f"{config.logprob_chunk_tokens} must be >= 0 (0: no cap)"
        )
    elif not problems:  # the accumulation the budget makes; steps_per_generation must match it
        accumulation = micro_batches(rows, accumulation, config.max_rows_per_micro_batch)
    if config.steps_per_generation not in (None, accumulation) or config.generation_batch_size is not None:
        problems.append(
            f"steps_per_generation={config.steps_per_generation} / generation_batch_size="
            f"{config.generation_batch_size}: agentforge samples one batch per optimizer step "
            f"(steps_per_generation = gradient_accumulation_steps = {accumulation}); leave both unset"
        )
    if config.loss_type in SPLIT_DEPENDENT_LOSSES:
        problems.append(
            f"loss_type={config.loss_type!r} normalises each micro-batch by its own token count, so the update "
            f"changes with gradient_accumulation_steps and the number of processes; use "
            f"{SPLIT_DEPENDENT_LOSSES[config.loss_type]}"
        )
    mode = config.vllm_importance_sampling_mode
    if (
        config.loss_type == "vespo"
        and config.vllm_importance_sampling_correction
        and not mode.startswith("token")
    ):
        problems.append(
            f"loss_type='vespo' needs vllm_importance_sampling_mode 'token_truncate' or 'token_mask' (got {mode!r})"
        )
    return problems


def part_credit_problems(config: TrainConfig) -> list[str]:
    """What is wrong with ``config``'s part-credit settings (empty when nothing): part names that do not parse,
    ``reward_weights`` other than the ``[1, 0, 0]`` part credit sets."""
    problems = []
    for name in ("call_parts", "reply_parts"):
        try:
            parse_parts(getattr(config, name), name)
        except ConfigError as exc:
            problems.append(str(exc))
    if config.reward_weights is not None and list(config.reward_weights) != [1.0, 0.0, 0.0]:
        problems.append(
            f"part_credit with reward_weights={config.reward_weights} (part credit sets them: the stored reward "
            "weighs 1, the two role rewards 0)"
        )
    return problems
