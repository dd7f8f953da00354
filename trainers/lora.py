"""The LoRA fields every trainer config shares (GRPO's :class:`TrainConfig`, replay SFT's config), checked once.

A config mixes :class:`LoraFields` in ahead of its TRL base (``class TrainConfig(LoraFields, GRPOConfig)``):
the four fields, their defaults and help texts, :meth:`LoraFields.lora_problems` (called from the config's
``__post_init__``, so the numbers land in its ``ConfigError``) and :meth:`LoraFields.lora_config` (the
``peft.LoraConfig`` of the policy adapter) are written here only. Hu et al. 2021, "LoRA: Low-Rank
Adaptation of Large Language Models" (arXiv:2106.09685).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from peft import LoraConfig

__all__ = ["LoraFields"]


@dataclass
class LoraFields:
    """The ``peft.LoraConfig`` of the policy adapter, as config fields.

    Attributes:
        lora_r: the rank ``r`` (≥ 1); it must not exceed the server's ``--max-lora-rank``.
        lora_alpha: the scale ``α`` (> 0); the update is scaled by ``α / r``.
        lora_dropout: dropout on the adapter's input, in ``[0, 1)``.
        lora_target_modules: the modules to adapt (``"all-linear"``, or names ``peft`` accepts).
    """

    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: str = field(default="all-linear", metadata={"help": "LoRA target modules."})

    def lora_problems(self) -> list[str]:
        """What is out of range, one ``"name=value (the rule)"`` entry each; empty when all is well."""
        problems = []
        if self.lora_r < 1:
            problems.append(f"lora_r={self.lora_r} (must be >= 1)")
        if self.lora_alpha <= 0:
            problems.append(f"lora_alpha={self.lora_alpha} (must be > 0)")
        if not 0.0 <= self.lora_dropout < 1.0:
            problems.append(f"lora_dropout={self.lora_dropout} (must be in [0, 1))")
        return problems

    def lora_config(self) -> LoraConfig:
        """The ``peft.LoraConfig`` for the policy adapter (causal LM task).

        Raises:
            ImportError: ``peft`` is not installed (the ``train`` extra).
        """
        from peft import LoraConfig

        return LoraConfig(
            r=self.lora_r,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            target_modules=self.lora_target_modules,
            task_type="CAUSAL_LM",
        )
