"""The LoRA fields every trainer config shares (GRPO's :class:`TrainConfig`, replay SFT's config), checked once.

A config mixes :class:`LoraFields` in ahead of its TRL base (``class TrainConfig(LoraFields, GRPOConfig)``):
the four fields, their defaults and help texts, :meth:`LoraFields.lora_problems` (called from the config's
``__post_init__``, so the numbers land in its ``ConfigError``) and :meth:`LoraFields.lora_config` (the
``peft.LoraConfig`` of the policy adapter) are written here only, and so is :meth:`LoraFields.policy`, the
model a trainer starts from: the base with a fresh LoRA, or a trainable copy of ``init_adapter``. Hu et al. 2021, "LoRA: Low-Rank
Adaptation of Large Language Models" (arXiv:2106.09685).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
        init_adapter: a PEFT adapter folder to continue (its own rank and targets then apply); ``""``: a
            fresh LoRA with the fields above.
    """

    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: str = field(default="all-linear", metadata={"help": "LoRA target modules."})
    init_adapter: str = field(default="", metadata={"help": "Continue from this LoRA adapter directory."})

    def lora_problems(self) -> list[str]:
        """What is out of range, one ``"name=value (the rule)"`` entry each; empty when all is well."""
        problems = []
        if self.lora_r < 1:
            problems.append(f"lora_r={self.lora_r} (must be >= 1)")
        if self.lora_alpha <= 0:
            problems.append(f"lora_alpha={self.lora_alpha} (must be > 0)")
        if not 0.0 <= self.lora_dropout < 1.0:
            problems.append(f"lora_dropout={self.lora_dropout} (must be in [0, 1))")
        if self.init_adapter and not (Path(self.init_adapter) / "adapter_config.json").is_file():
            problems.append(
                f"init_adapter={self.init_adapter!r} is not a PEFT adapter folder (no adapter_config.json)"
            )
        return problems

    def policy(self, model_path: str | Path, bf16: bool) -> tuple[Any, LoraConfig | None]:
        """TRL's ``model`` and ``peft_config`` arguments: the base path and a fresh LoRA, or (``init_adapter``
        set) a trainable ``PeftModel`` continuing that adapter and no config.

        Args:
            model_path: the base model folder.
            bf16: load the base in bfloat16 (else float32) when continuing an adapter.

        Raises:
            ImportError: ``peft`` / ``transformers`` are not installed (the ``train`` extra).
        """
        if not self.init_adapter:
            return str(model_path), self.lora_config()
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch.bfloat16 if bf16 else torch.float32
        )
        return PeftModel.from_pretrained(base, self.init_adapter, is_trainable=True), None

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
