"""``ReplaySFTConfig``: TRL's ``SFTConfig`` plus the replay settings of agentforge, validated when built.

The config of :class:`~agentforge.trainers.replay.sft_trainer.ReplaySFTTrainer` (named as TRL pairs
``sft_config`` with ``sft_trainer``); its LoRA fields are the ones every trainer config shares
(:class:`~agentforge.trainers.lora.LoraFields`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agentforge.errors import ConfigError, MissingExtraError
from agentforge.trainers.lora import LoraFields
from agentforge.trainers.progress import adopt_activation_checkpointing

try:
    from trl.trainer.sft_config import SFTConfig
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtraError(exc.name or "trl", "train", "replay SFT") from exc

__all__ = ["ReplaySFTConfig"]


@dataclass
class ReplaySFTConfig(LoraFields, SFTConfig):
    """TRL's ``SFTConfig`` plus the replay settings of agentforge, validated when built.

    ``completion_only_loss`` is always ``True`` here (the loss covers sampled tokens only); passing
    ``False`` is a :class:`~agentforge.errors.ConfigError`. All other TRL fields keep TRL's defaults.

    Attributes:
        min_reward: train only on rollouts whose reward is at least this (the filter's own
            ``min_reward``, if higher, wins). Default 1.0: the triage reward's "correct".
        dedupe: train once on trajectories whose token ids and mask are identical (many samples of one
            task often produce the same answer); the extras are counted as ``duplicate`` skips.
        skip_truncated: drop trajectories whose call hit the token limit (``finish_reason == "length"``);
            off by default, since short-answer agents (triage: 4 tokens) always end that way.
        lora_r / lora_alpha / lora_dropout / lora_target_modules: the ``peft.LoraConfig``, the field set
            every trainer config shares (:class:`~agentforge.trainers.lora.LoraFields`); rank must not
            exceed the server's ``--max-lora-rank``.
        share_prompt_prefix: compute each batch's loss with the prompts' common head run once and its KV
            cache repeated over the rows (:mod:`agentforge.trainers.replay.prefix_sft`); same loss, metrics
            and gradients as TRL's per-row pass up to rounding. ``False`` uses TRL's own pass. Under
            ``gradient_checkpointing`` (TRL's default) the training pass cannot share, since checkpointed
            layers drop KV caches; set ``gradient_checkpointing=False`` for the speed-up, and batch the
            examples that share a head together (``per_device_train_batch_size``): the head runs once per
            micro-batch.
    """

    min_reward: float = field(default=1.0, metadata={"help": "Train on rollouts with reward >= this."})
    dedupe: bool = field(default=True, metadata={"help": "Train once on identical trajectories."})
    skip_truncated: bool = field(
        default=False, metadata={"help": "Drop trajectories cut by the token limit."}
    )
    share_prompt_prefix: bool = field(
        default=True,
        metadata={"help": "Run each batch's shared prompt head once per loss pass (shared-prefix forward)."},
    )

    def __post_init__(self) -> None:
        problems = []
        if self.completion_only_loss is False:
            problems.append(
                "completion_only_loss=False (replay SFT trains on sampled tokens only; leave it unset)"
            )
        self.completion_only_loss = True
        adopt_activation_checkpointing(self)  # TRL's default under transformers' new name: no FutureWarning
        super().__post_init__()
        if not math.isfinite(self.min_reward):
            problems.append(f"min_reward={self.min_reward} (must be a finite number)")
        problems += self.lora_problems()
        if self.max_length is not None and self.max_length < 2:
            problems.append(f"max_length={self.max_length} (must be >= 2 tokens, or None)")
        if problems:
            raise ConfigError("invalid ReplaySFTConfig: " + "; ".join(problems))
