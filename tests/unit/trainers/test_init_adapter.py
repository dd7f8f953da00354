"""``TrainConfig.init_adapter``: GRPO continues from a saved LoRA adapter (the replay SFT warm start) instead of a
fresh one — real TRL steps on the tiny model over stored groups."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_model import scored_rollout, tiny_model

from agentforge.errors import ConfigError
from agentforge.testing import memory_store
from agentforge.trainers.replay.select import TraceFilter, select_traces

AGENT = "init-adapter"


class _Publisher:
    def __init__(self) -> None:
        self.dirs: list[Path] = []

    def current(self) -> str:
        return f"policy@v{len(self.dirs)}"

    def publish(self, adapter_dir: Path, step: int) -> str:
        self.dirs.append(Path(adapter_dir))
        return self.current()


def _trainer(tmp_path: Path, name: str, **config_kw: object):  # type: ignore[no-untyped-def]
    from agentforge.trainers.grpo_config import TrainConfig
    from agentforge.trainers.grpo_trainer import LightningTrainer
    from agentforge.trainers.replay.grpo import StoredGroupSource

    store = memory_store()
    for completion, reward in (([57, 1431, 2], 1.0), ([36, 2], 0.0)):
        scored_rollout(store, AGENT, "g", completion, reward)
    groups = select_traces(store, TraceFilter(agent=AGENT, require_reward=False)).groups()
    config = TrainConfig(
        output_dir=str(tmp_path / name), num_generations=2, tasks_per_step=1, max_steps=1, swap_every=1,
        learning_rate=1e-2, lora_r=4, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
        bf16=False, seed=0, gradient_checkpointing=False, **config_kw,
    )  # fmt: skip
    publisher = _Publisher()
    return LightningTrainer(
        tiny_model(), store, None, config, publisher, source=StoredGroupSource(groups, 2)
    ), publisher


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
