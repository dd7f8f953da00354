"""What a training checkpoint holds, checked before a resume, so an incomplete one is never taken as whole.

``transformers.Trainer`` resumes from whatever a checkpoint folder holds and skips, with at most an ``INFO``
line, the parts it does not find: a checkpoint saved with ``save_only_model=True`` (the adapter and the step
counter only), or a published adapter folder (``{output_dir}/adapters/step-N``) passed as a checkpoint, resumes
with a fresh optimizer (Adam's moments at zero), a learning-rate schedule restarted from its warm-up, and
unrestored random state, and nothing says so. :func:`checkpoint_gaps` names each missing part and what the
resumed run loses without it; the lightning trainer logs them as one warning, records them as a
``trainer.resume`` span and returns them from ``train()`` (``"resume"``). A folder without adapter weights or
without the step counter (``trainer_state.json``) cannot be resumed at all: :func:`resume_checkpoint` raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agentforge.errors import UserError

__all__ = ["CHECKPOINT_PARTS", "ResumeReport", "checkpoint_gaps", "resume_checkpoint"]

#: Part of a full checkpoint → (the file names ``transformers`` writes for it, what a resume lacks without it).
CHECKPOINT_PARTS: dict[str, tuple[tuple[str, ...], str]] = {
    "optimizer": (
        ("optimizer.pt", "optimizer.bin"),
        "optimizer state (optimizer.pt): Adam's moments restart at zero",
    ),
    "scheduler": (
        ("scheduler.pt",),
        "learning-rate scheduler state (scheduler.pt): the schedule restarts from its first step",
    ),
    "rng": (
        ("rng_state.pth", "rng_state_0.pth"),
        "random state (rng_state.pth): dropout and other random draws differ from the uninterrupted run",
    ),
}
_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin", "model.safetensors", "pytorch_model.bin")
_STATE = "trainer_state.json"


@dataclass
class ResumeReport:
    """What a resume started from.

    Attributes:
        checkpoint: the checkpoint folder.
        missing: one sentence per missing part (see :data:`CHECKPOINT_PARTS`); empty for a full checkpoint.
    """

    checkpoint: str
    missing: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether the checkpoint holds every part a true continuation needs."""
        return not self.missing


def checkpoint_gaps(folder: str | Path) -> list[str]:
    """The parts of a full checkpoint that ``folder`` lacks, each with what a resume loses without it.

    Args:
        folder: a checkpoint folder (``{output_dir}/checkpoint-N``).

    Returns:
        One sentence per missing part, in the order of :data:`CHECKPOINT_PARTS`; empty when complete.
        DeepSpeed checkpoints (a ``global_step*`` folder inside) keep optimizer state in their own files and
        count as holding it.
    """
    path = Path(folder)
    deepspeed = any(path.glob("global_step*"))
    out = []
    for part, (names, consequence) in CHECKPOINT_PARTS.items():
        if part == "optimizer" and deepspeed:
            continue
        if not any((path / name).exists() for name in names):
            out.append(consequence)
    return out


def resume_checkpoint(output_dir: str | Path, resume_from_checkpoint: bool | str) -> ResumeReport | None:
    """Resolve ``resume_from_checkpoint`` as ``transformers.Trainer.train`` would and check the folder.

    Args:
        output_dir: the run's output folder.
        resume_from_checkpoint: ``True`` (the last ``checkpoint-N`` in ``output_dir``) or a folder.

    Returns:
        The :class:`ResumeReport`, or ``None`` when ``True`` finds no checkpoint (a fresh start).

    Raises:
        UserError: the folder does not exist, holds no model or adapter weights, or has no
            ``trainer_state.json`` (without the step counter the run cannot continue where it stopped; start a
            new run instead).
    """
    if resume_from_checkpoint is True:
        from transformers.trainer_utils import get_last_checkpoint

        last = get_last_checkpoint(str(output_dir)) if Path(output_dir).is_dir() else None
        if last is None:
            return None
        folder = Path(last)
    else:
        folder = Path(str(resume_from_checkpoint))
    if not folder.is_dir():
        raise UserError(f"cannot resume from {folder}: no such checkpoint folder")
    if not any((folder / name).exists() for name in _WEIGHTS):
        raise UserError(
            f"cannot resume from {folder}: it holds no adapter or model weights ({', '.join(_WEIGHTS)})"
        )
    if not (folder / _STATE).exists():
        raise UserError(
            f"cannot resume from {folder}: it has no {_STATE}, so the step, the learning-rate schedule's position "
            "and the data cursor are unknown (an adapter folder is not a checkpoint); resume from a "
            "checkpoint-N folder, or start a new run"
        )
    return ResumeReport(str(folder), checkpoint_gaps(folder))
