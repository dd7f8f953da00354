"""Trace replay: train on traces already in the store (SFT, offline GRPO).

The data layer: :func:`select_traces` picks stored rollouts with a :class:`TraceFilter`;
:func:`export_jsonl` / :func:`import_jsonl` move them between stores as JSON Lines
(``agentforge.trace/1``); :func:`to_hf_dataset` / :func:`export_hf` lay them out as a Hugging Face
``datasets.Dataset`` for training. Nothing heavy is imported until used (``datasets`` only by the HF
functions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentforge.trainers.replay.select import (
    EmptySelectionError,
    Selection,
    TraceFilter,
    TraceRecord,
    select_traces,
)

if TYPE_CHECKING:
    from agentforge.trainers.replay.grpo import StoredGroupSource, run_offline_grpo
    from agentforge.trainers.replay.hf import export_hf, to_hf_dataset
    from agentforge.trainers.replay.jsonl import (
        FORMAT,
        ImportReport,
        TraceFormatError,
        export_jsonl,
        import_jsonl,
    )
    from agentforge.trainers.replay.output import ExportReport

__all__ = [
    "FORMAT",
    "EmptySelectionError",
    "ExportReport",
    "ImportReport",
    "Selection",
    "TraceFilter",
    "TraceFormatError",
    "TraceRecord",
    "export_hf",
    "export_jsonl",
    "import_jsonl",
    "select_traces",
    "to_hf_dataset",
    "StoredGroupSource",
    "run_offline_grpo",
]

_LAZY = {
    "FORMAT": "agentforge.trainers.replay.jsonl",
    "ExportReport": "agentforge.trainers.replay.output",
    "ImportReport": "agentforge.trainers.replay.jsonl",
    "TraceFormatError": "agentforge.trainers.replay.jsonl",
    "export_jsonl": "agentforge.trainers.replay.jsonl",
    "import_jsonl": "agentforge.trainers.replay.jsonl",
    "export_hf": "agentforge.trainers.replay.hf",
    "to_hf_dataset": "agentforge.trainers.replay.hf",
    "StoredGroupSource": "agentforge.trainers.replay.grpo",
    "run_offline_grpo": "agentforge.trainers.replay.grpo",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentforge.trainers.replay' has no attribute {name!r}")
