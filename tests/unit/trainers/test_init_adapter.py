"""``TrainConfig.init_adapter``: GRPO continues from a saved LoRA adapter (the replay SFT warm start) instead of a
fresh one — real TRL steps on the tiny model over stored groups."""

from __future__ import annotations

from pathlib import Path

import pytest
from stored_groups import stored_group_trainer
from tiny_model import scored_rollout

from agentforge.errors import ConfigError
from agentforge.testing import memory_store

AGENT = "init-adapter"


def _trainer(tmp_path: Path, name: str, **config_kw: object):  # type: ignore[no-untyped-def]
    store = memory_store()
    for completion, reward in (([57, 1431, 2], 1.0), ([36, 2], 0.0)):
        scored_rollout(store, AGENT, "g", completion, reward)
    return stored_group_trainer(tmp_path / name, store, AGENT, **config_kw)


def _lora(trainer) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {k: v.detach().clone() for k, v in trainer.trainer.model.named_parameters() if "lora_" in k}


@pytest.mark.slow
def test_grpo_continues_from_a_saved_adapter(tmp_path: Path) -> None:
    import torch

    first, published = _trainer(tmp_path, "first")
    first.train()
    (saved,) = published.dirs
    trained = _lora(first)
    second, _ = _trainer(tmp_path, "second", init_adapter=str(saved))
    start = _lora(second)
    assert start.keys() == trained.keys() and start  # the same LoRA modules, trainable
    assert all(torch.equal(start[k], trained[k]) for k in start)  # it starts where the first run ended
    assert any(p.requires_grad for n, p in second.trainer.model.named_parameters() if "lora_" in n)
    second.train()
    assert any(not torch.equal(_lora(second)[k], start[k]) for k in start)  # and it keeps learning


def test_init_adapter_must_be_an_adapter_folder(tmp_path: Path) -> None:
    from agentforge.trainers.grpo_config import TrainConfig

    with pytest.raises(ConfigError, match="not a PEFT adapter folder"):
        TrainConfig(output_dir=str(tmp_path), init_adapter=str(tmp_path), use_cpu=True, report_to="none")
