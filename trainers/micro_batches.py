"""How one step's rows are split into micro-batches: how many (a row budget) and which rows go together.

**How many.** :func:`micro_batches` turns :class:`~agentforge.trainers.grpo_config.TrainConfig`'s
``max_rows_per_micro_batch`` into ``gradient_accumulation_steps``: the fewest equal micro-batches of at most that
many rows. The GRPO update does not depend on the split (``tests/unit/trainers/test_loss_invariance.py``), so
the budget trades only speed for memory: an update's peak grows with the rows of one micro-batch × their length.

**Which rows.** TRL shuffles a generation batch's rows before splitting it (``GRPOTrainer._prepare_inputs``), so a
micro-batch of 8 rows out of 4 groups of 8 holds rows of 3-4 prompts, and the shared-prefix pass
(:mod:`agentforge.trainers.prefix`) runs each of those prompts again in every micro-batch: more prompt tokens
per micro-batch (memory) and per step (time). :func:`group_shuffle` shuffles whole groups instead (rows with the
same prompt ids stay consecutive, in a random group order), so a micro-batch whose size is a multiple of the
group size holds whole groups. The order of rows within one optimizer step changes nothing in the update (the
loss is a sum over micro-batches; TRL takes one optimizer step per generation batch here). Measured with
``benchmarks/update_memory.py``. :func:`grouped_split` swaps it in for TRL's ``shuffle_sequence_dict`` around
one ``_prepare_inputs`` call (a private name, so it checks the tested TRL release first).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from agentforge.errors import ConfigError

__all__ = ["group_shuffle", "grouped_split", "micro_batches"]


def micro_batches(rows: int, accumulation: int, max_rows: int) -> int:
    """The fewest equal micro-batches, at least ``accumulation``, of at most ``max_rows`` rows each.

    Args:
        rows: the step's rows per process, ``tasks_per_step × num_generations``.
        accumulation: the ``gradient_accumulation_steps`` given (a divisor of ``rows``).
        max_rows: the most rows per micro-batch (``max_rows_per_micro_batch``); 0: no cap.

    Returns:
        ``accumulation`` when its micro-batches fit (or no cap), else the smallest divisor ``a`` of ``rows`` with
        ``rows / a <= max_rows`` (``rows`` itself, one row per micro-batch, always fits).

    Raises:
        ConfigError: ``max_rows`` is negative, or ``accumulation`` does not divide ``rows`` (with the numbers).
    """
    if max_rows < 0 or accumulation < 1 or rows % accumulation:
        raise ConfigError(
            f"cannot split {rows} rows into micro-batches: gradient_accumulation_steps={accumulation} must divide "
            f"them and max_rows_per_micro_batch={max_rows} must be >= 0"
        )
    if not max_rows or rows // accumulation <= max_rows:
        return accumulation
    return next(a for a in range(accumulation + 1, rows + 1) if rows % a == 0 and rows // a <= max_rows)


def group_shuffle(batch: dict[str, Any]) -> dict[str, Any]:
    """TRL's ``shuffle_sequence_dict`` with each prompt group's rows kept together (module docstring).

    Args:
        batch: a generation batch: ``prompt_ids`` ``(N, P)`` (and ``prompt_mask``, 0 on padding) and any other
            per-row values (tensors with first dimension ``N`` or lists of ``N``); 0-d tensors and ``None`` are
            kept as they are.

    Returns:
        The batch with its rows permuted: groups of identical prompts in a random order (``torch.randperm``,
        TRL's generator), each group's rows consecutive and in their original order.
    """
    ids = batch["prompt_ids"]
    mask = batch.get("prompt_mask")
    keys = [
        bytes(row[m.bool()].cpu().numpy()) if mask is not None else bytes(row.cpu().numpy())
        for row, m in zip(ids, mask if mask is not None else ids, strict=True)
    ]
    groups: dict[bytes, list[int]] = {}
    for row, key in enumerate(keys):
        groups.setdefault(key, []).append(row)
    members = list(groups.values())
    order = [row for g in torch.randperm(len(members)).tolist() for row in members[g]]
    index = torch.tensor(order, device=ids.device)

    def permute(value: torch.Tensor | Sequence[Any] | None) -> torch.Tensor | Sequence[Any] | None:
        if value is None or (isinstance(value, torch.Tensor) and value.ndim == 0):
            return value
        if isinstance(value, torch.Tensor):
            return value[index.to(value.device)]
        return [value[i] for i in order]

    return {key: permute(value) for key, value in batch.items()}


@contextmanager
def grouped_split() -> Iterator[None]:
    """Inside: TRL's ``GRPOTrainer._prepare_inputs`` shuffles whole groups (:func:`group_shuffle`).

    Raises:
        UserError: the installed TRL is not the tested release.
    """
    from trl.trainer import grpo_trainer

    from agentforge.trainers.trl_private import check_trl_version

    check_trl_version("trl.trainer.grpo_trainer.shuffle_sequence_dict (grouped by agentforge)")
    # TRL's own module binding (an import it does not re-export), replaced on purpose while inside
    original = grpo_trainer.shuffle_sequence_dict  # type: ignore[attr-defined]
    grpo_trainer.shuffle_sequence_dict = group_shuffle  # type: ignore[attr-defined]
    try:
        yield
    finally:
        grpo_trainer.shuffle_sequence_dict = original  # type: ignore[attr-defined]
