"""``TrainConfig``: TRL's ``GRPOConfig`` plus the fields agentforge adds, validated when built.

Defaults follow the written policy (STYLE 6): paper/TRL values for hyper-parameters; the one obvious dial
is ``num_generations`` (the GRPO group size G). Fields added here only concern the decoupled loop:
rollouts are executed by runners through the gateway, adapters are hot-swapped every ``swap_every``
optimizer steps, and samples older than ``max_staleness`` versions are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentforge.errors import ConfigError, MissingExtraError
from agentforge.trainers.lora import LoraFields
from agentforge.trainers.progress import adopt_activation_checkpointing

try:
    from trl import GRPOConfig
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtraError("trl", "train", "the lightning trainer") from exc

__all__ = ["TrainConfig"]


@dataclass
class TrainConfig(LoraFields, GRPOConfig):
    """GRPO hyper-parameters (TRL) plus the decoupled-loop settings of agentforge.

    Attributes:
        tasks_per_step: distinct tasks per optimizer step; each runs ``num_generations`` rollouts. The
            batch size is derived from it (``per_device_train_batch_size = tasks_per_step ×
            num_generations``) and overrides any value passed.
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
        share_prompt_prefix: compute log-probabilities with one prompt pass per group and the KV cache
            repeated over its ``G`` completions (:mod:`agentforge.trainers.prefix`); same values and
            gradients as TRL's per-row pass up to rounding. ``False`` uses TRL's own pass. Under
            ``gradient_checkpointing`` (TRL's default) only the no-grad passes share, since checkpointed
            layers drop KV caches; set ``gradient_checkpointing=False`` for the full speed-up.
    """

    tasks_per_step: int = field(default=4, metadata={"help": "Distinct tasks per optimizer step."})
    swap_every: int = field(default=1, metadata={"help": "Hot-swap the adapter every k optimizer steps."})
    max_staleness: int = field(default=1, metadata={"help": "Drop samples more than this many versions old."})
    alias: str = field(default="policy", metadata={"help": "Model alias the agents call."})
    agent_name: str = field(default="", metadata={"help": "Agent name on the enqueued rollouts."})
    rollout_timeout_s: float = field(default=300.0, metadata={"help": "Per-attempt rollout time limit (s)."})
    wait_timeout_s: float = field(default=1800.0, metadata={"help": "Max wait for a step's rollouts (s)."})
    rollout_max_attempts: int = field(default=2, metadata={"help": "Attempts per rollout."})
    share_prompt_prefix: bool = field(
        default=True,
        metadata={"help": "Run each group's prompt once per log-prob pass (shared-prefix forward)."},
    )

    def __post_init__(self) -> None:
        # One optimizer step trains on exactly one batch of groups: the batch size is derived, not set.
        self.per_device_train_batch_size = self.tasks_per_step * self.num_generations
        self.steps_per_generation = self.gradient_accumulation_steps
        adopt_activation_checkpointing(self)  # TRL's default under transformers' new name: no FutureWarning
        super().__post_init__()
        problems = []
        if self.num_generations < 2:
            problems.append(f"num_generations={self.num_generations} (GRPO needs a group of at least 2)")
        if self.tasks_per_step < 1:
            problems.append(f"tasks_per_step={self.tasks_per_step} (must be >= 1)")
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
