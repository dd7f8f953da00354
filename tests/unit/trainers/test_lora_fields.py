"""One LoRA field set serves the GRPO and the replay SFT configs: same fields, same checks, same adapter."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from agentforge.errors import ConfigError
from agentforge.trainers.grpo_config import TrainConfig
from agentforge.trainers.lora import LoraFields
from agentforge.trainers.replay.sft_config import ReplaySFTConfig

CONFIGS = [TrainConfig, ReplaySFTConfig]


def _lora(cls: type) -> dict[str, tuple[object, object]]:
    return {f.name: (f.default, f.metadata.get("help")) for f in fields(cls) if f.name.startswith("lora_")}


def test_both_configs_carry_exactly_the_shared_lora_fields() -> None:
    shared = _lora(LoraFields)
    assert set(shared) == {"lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"}
    for cls in CONFIGS:
        assert issubclass(cls, LoraFields) and _lora(cls) == shared


@pytest.mark.parametrize("cls", CONFIGS)
def test_lora_values_are_checked_alike_and_make_the_adapter_config(cls: type, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"lora_r=0 \(must be >= 1\); lora_alpha=0 .*lora_dropout=1.0"):
        cls(output_dir=str(tmp_path), use_cpu=True, bf16=False, lora_r=0, lora_alpha=0, lora_dropout=1.0)
    config = cls(output_dir=str(tmp_path), use_cpu=True, bf16=False, lora_r=4, lora_alpha=8, lora_dropout=0.1)
    lora = config.lora_config()
    assert (lora.r, lora.lora_alpha, lora.lora_dropout, lora.target_modules) == (4, 8, 0.1, "all-linear")
    assert lora.task_type == "CAUSAL_LM"
