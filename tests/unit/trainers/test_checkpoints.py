"""What a checkpoint lacks is named before a resume (``trainers.checkpoints``).

Guards against: an adapter-only checkpoint (``save_only_model=True``) resumed as if complete (fresh Adam
moments, a restarted schedule, other random draws, and no word about it); an adapter folder taken for a
checkpoint (no step counter: the run would restart at step 0 over data it already trained on).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentforge.errors import UserError
from agentforge.trainers.checkpoints import checkpoint_gaps, resume_checkpoint

FULL = ("adapter_model.safetensors", "trainer_state.json", "optimizer.pt", "scheduler.pt", "rng_state.pth")


def _checkpoint(folder: Path, files: tuple[str, ...]) -> Path:
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_bytes(b"x")
    return folder


def test_a_full_checkpoint_lacks_nothing_and_true_finds_the_last(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "checkpoint-2", FULL)
    _checkpoint(tmp_path / "checkpoint-4", FULL)
    report = resume_checkpoint(tmp_path, True)
    assert report is not None and report.checkpoint == str(tmp_path / "checkpoint-4") and report.complete


def test_an_adapter_only_checkpoint_names_each_missing_part(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path / "checkpoint-2", ("adapter_model.safetensors", "trainer_state.json"))
    missing = checkpoint_gaps(folder)
    assert [m.split(" (")[1].split(")")[0] for m in missing] == [
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
    ]
    assert "Adam's moments restart at zero" in missing[0]
    assert resume_checkpoint(tmp_path, str(folder)).missing == missing  # type: ignore[union-attr]


def test_what_cannot_be_resumed_is_a_clear_error(tmp_path: Path) -> None:
    assert resume_checkpoint(tmp_path / "empty", True) is None  # nothing yet: a fresh start
    adapter = _checkpoint(
        tmp_path / "adapters" / "step-2", ("adapter_model.safetensors", "adapter_config.json")
    )
    with pytest.raises(UserError, match="no trainer_state.json"):
        resume_checkpoint(tmp_path, str(adapter))
    with pytest.raises(UserError, match="no adapter or model weights"):
        resume_checkpoint(tmp_path, str(_checkpoint(tmp_path / "checkpoint-9", ("trainer_state.json",))))
    with pytest.raises(UserError, match="no such checkpoint folder"):
        resume_checkpoint(tmp_path, str(tmp_path / "checkpoint-77"))
