"""Issue 35, item 1: the optimizer state travels with the adapter lineage across GRPO rounds.

Each round is a new ``LightningTrainer`` (one real TRL step on the tiny model over a stored group) that continues
the served adapter (``init_adapter = served_adapter_dir(store)``). The optimizer state saved beside a published
adapter is what the next round's first step starts from; a refused candidate's state is dropped with its
weights; an adapter without state, or with state that does not fit, starts a fresh optimizer (the latter warns).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from stored_groups import stored_group_trainer
from tiny_model import scored_rollout
from transformers import TrainerCallback

from agentforge.testing import memory_store
from agentforge.trainers.lineage import OPTIMIZER_STATE_FILE, served_adapter_dir
from agentforge.types import ResourceVersion

AGENT = "lineage"


class StorePublisher:
    """Records each adapter in the store, as the real publishers do, and activates it only when ``accept``."""

    def __init__(self, store: Any, accept: bool) -> None:
        self.store, self.accept = store, accept

    def current(self) -> str:
        return (
            f"policy@v{self.store.get_resource('policy').version}"
            if served_adapter_dir(self.store)
            else "policy@v0"
        )

    def publish(self, adapter_dir: Path, step: int) -> str:
        record = ResourceVersion(
            name="policy", kind="adapter", payload={"path": str(adapter_dir), "step": step}
        )
        record = self.store.publish_resource(record, activate=self.accept)
        return record.ref if self.accept else self.current()


class FirstStepState(TrainerCallback):
    """The optimizer's state, by parameter name, just before the run's first optimizer step."""

    def __init__(self) -> None:
        self.state: dict[str, dict[str, torch.Tensor]] | None = None

    def on_pre_optimizer_step(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        if self.state is None:
            self.state = _named_state(kw["optimizer"], kw["model"])


def _named_state(optimizer: Any, model: Any) -> dict[str, dict[str, torch.Tensor]]:
    inner = getattr(optimizer, "optimizer", optimizer)
    return {
        n: {k: v.detach().clone() for k, v in inner.state[p].items()}
        for n, p in model.named_parameters()
        if p.requires_grad and p in inner.state
    }


def _round(store: Any, out: Path, accept: bool = True, init_adapter: str | None = None, **config_kw: Any):  # type: ignore[no-untyped-def]
    """One GRPO round continuing ``init_adapter`` (default: the served adapter); returns the trainer, the
    state its first step started from, and its optimizer's final state."""
    folder = served_adapter_dir(store) if init_adapter is None else init_adapter
    trainer, _ = stored_group_trainer(out, store, AGENT, init_adapter=folder, learning_rate=1e-3, **config_kw)
    trainer.publisher = StorePublisher(store, accept)
    first = FirstStepState()
    trainer.trainer.add_callback(first)
    trainer.train()
    return trainer, first.state, _named_state(trainer.trainer.optimizer, trainer.trainer.model)


def _assert_same_state(
    got: dict[str, dict[str, torch.Tensor]], want: dict[str, dict[str, torch.Tensor]]
) -> None:
    assert got.keys() == want.keys() and got
    for name, tensors in want.items():
        assert got[name].keys() == tensors.keys() == {"step", "exp_avg", "exp_avg_sq"}, name
        for key, value in tensors.items():
            assert torch.equal(got[name][key], value), f"{name}.{key}"


@pytest.fixture
def store():  # type: ignore[no-untyped-def]
    store = memory_store()
    for completion, reward in (([57, 1431, 2], 1.0), ([36, 2], 0.0)):
        scored_rollout(store, AGENT, "g", completion, reward)
    return store


def test_the_next_round_starts_from_the_promoted_adapters_moments(tmp_path: Path, store: Any) -> None:
    assert served_adapter_dir(store) == ""  # nothing published: the first round starts a fresh adapter
    first, fresh, saved = _round(store, tmp_path / "r1")
    assert fresh == {} and first.trainer.lineage_loaded is None  # Adam's moments start at zero (no state)
    promoted = served_adapter_dir(store)
    assert promoted == str(tmp_path / "r1" / "adapters" / "step-1")
    assert (Path(promoted) / OPTIMIZER_STATE_FILE).is_file()

    second, start, end = _round(store, tmp_path / "r2")
    _assert_same_state(start, saved)  # the first step of round 2 starts from round 1's moments
    assert all(float(s["step"]) == 1 for s in start.values()) and all(
        float(s["step"]) == 2 for s in end.values()
    )
    assert second.trainer.lineage_loaded == {
        "path": str(Path(promoted) / OPTIMIZER_STATE_FILE),
        "lineage_steps": 1,
    }
    payload = torch.load(tmp_path / "r2" / "adapters" / "step-1" / OPTIMIZER_STATE_FILE, weights_only=True)
    assert payload["lineage_steps"] == 2


def test_a_refused_candidate_is_dropped_with_its_moments(tmp_path: Path, store: Any) -> None:
    _, _, saved = _round(store, tmp_path / "r1")
    served = served_adapter_dir(store)
    _, _, refused = _round(store, tmp_path / "r2", accept=False)  # a candidate the gate refused
    assert served_adapter_dir(store) == served  # the promoted adapter still serves
    _, start, _ = _round(store, tmp_path / "r3")  # so the next round continues it: its weights, its moments
    _assert_same_state(start, saved)
    assert any(not torch.equal(start[n]["exp_avg"], refused[n]["exp_avg"]) for n in start)


def test_an_adapter_without_optimizer_state_starts_fresh_quietly(
    tmp_path: Path, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _round(store, tmp_path / "r1")
    sft = tmp_path / "sft-adapter"  # e.g. the replay-SFT warm start: weights only
    shutil.copytree(served_adapter_dir(store), sft, ignore=shutil.ignore_patterns(OPTIMIZER_STATE_FILE))
    with caplog.at_level(logging.WARNING, logger="agentforge.trainer"):
        trainer, start, _ = _round(store, tmp_path / "r2", init_adapter=str(sft))
    assert start == {} and trainer.trainer.lineage_loaded is None and trainer.trainer.lineage_steps == 0
    assert not [r for r in caplog.records if "optimizer state" in r.getMessage()]


def test_state_that_does_not_fit_warns_and_training_continues_fresh(
    tmp_path: Path, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _round(store, tmp_path / "r4-run", lora_r=4)
    _round(store, tmp_path / "r8-run", init_adapter="", lora_r=8)  # another lineage: rank 8
    mixed = tmp_path / "mixed"  # a rank-4 adapter beside a rank-8 optimizer state
    shutil.copytree(tmp_path / "r4-run" / "adapters" / "step-1", mixed)
    shutil.copy(
        tmp_path / "r8-run" / "adapters" / "step-1" / OPTIMIZER_STATE_FILE, mixed / OPTIMIZER_STATE_FILE
    )
    with caplog.at_level(logging.WARNING, logger="agentforge.trainer"):
        trainer, start, end = _round(store, tmp_path / "r-mixed", init_adapter=str(mixed))
    (warning,) = [
        r.getMessage() for r in caplog.records if "not loading the optimizer state" in r.getMessage()
    ]
    assert "has shape [4, " in warning and "the saved state [8, " in warning and "fresh optimizer" in warning
    assert start == {} and trainer.trainer.lineage_loaded is None
    assert trainer.trainer.state.global_step == 1 and all(float(s["step"]) == 1 for s in end.values())
