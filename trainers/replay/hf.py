"""Selected traces as a Hugging Face ``datasets.Dataset``: one row per trajectory, flat columns.

Columns (``T`` = one trajectory; shapes per row):

=================  ===================  ======================================================
column             type                 meaning
=================  ===================  ======================================================
prompt_ids         list[int64] ``(P,)``  engine ids of the trajectory's first prompt
completion_ids     list[int64] ``(C,)``  sampled ids with interleaved environment ids
logprobs           list[float64] (C,)   engine log-probabilities (nats); 0.0 where env_mask is 0
env_mask           list[int8] ``(C,)``   1 = sampled by the policy, 0 = environment token
reward             float64 or null      the rollout's final reward (null: none, kept by the filter)
rollout_id         string               the rollout
trajectory_index   int32                position of ``T`` among the rollout's trajectories
num_trajectories   int32                trajectories of the rollout
group_id           string or null       GRPO group
task_id            string               the rollout's task
agent              string               agent name
policy_version     string               version that sampled ``T``'s last call (e.g. ``policy@v3``)
versions           list[string]         versions of each call merged into ``T``
truncated          bool                 some call of ``T`` hit the token limit
created_at         float64              rollout creation time, epoch seconds
=================  ===================  ======================================================

``datasets`` is imported only here (the ``train`` extra).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentforge.errors import MissingExtraError
from agentforge.ports import TraceStore
from agentforge.privacy.ledger import record_export
from agentforge.trainers.replay.output import ExportReport, atomic_path
from agentforge.trainers.replay.select import (
    EmptySelectionError,
    Selection,
    TraceFilter,
    TraceRecord,
    select_traces,
)
from agentforge.trainers.samples import SAMPLE_COLUMNS, trajectory_sample

if TYPE_CHECKING:
    import datasets

__all__ = ["COLUMNS", "export_hf", "hf_features", "to_hf_dataset"]

#: The training sample's columns (:data:`~agentforge.trainers.samples.SAMPLE_COLUMNS`; its ``version`` is
#: ``policy_version`` here) followed by the trajectory's place and provenance.
COLUMNS = (
    *(c for c in SAMPLE_COLUMNS if c != "version"),
    "trajectory_index",
    "num_trajectories",
    "group_id",
    "task_id",
    "agent",
    "policy_version",
    "versions",
    "truncated",
    "created_at",
)


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise MissingExtraError("datasets", "train", "Exporting traces as a Hugging Face dataset") from None
    return datasets


def hf_features() -> datasets.Features:
    """The column types of :func:`to_hf_dataset` (see the module docstring).

    Raises:
        MissingExtraError: ``datasets`` is not installed.
    """
    ds = _datasets()
    ids = ds.List(ds.Value("int64"))
    return ds.Features(
        {
            "prompt_ids": ids,
            "completion_ids": ids,
            "logprobs": ds.List(ds.Value("float64")),
            "env_mask": ds.List(ds.Value("int8")),
            "reward": ds.Value("float64"),
            "rollout_id": ds.Value("string"),
            "trajectory_index": ds.Value("int32"),
            "num_trajectories": ds.Value("int32"),
            "group_id": ds.Value("string"),
            "task_id": ds.Value("string"),
            "agent": ds.Value("string"),
            "policy_version": ds.Value("string"),
            "versions": ds.List(ds.Value("string")),
            "truncated": ds.Value("bool"),
            "created_at": ds.Value("float64"),
        }
    )


def _rows(records: Iterable[TraceRecord]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for rec in records:
        ro = rec.rollout
        for i, traj in enumerate(rec.trajectories):
            row = trajectory_sample(traj, rec.reward, ro.rollout_id)
            del row["version"]  # exported as policy_version: the last recorded one, else the record's
            row |= {
                "trajectory_index": i,
                "num_trajectories": len(rec.trajectories),
                "group_id": ro.group_id,
                "task_id": ro.task.task_id,
                "agent": ro.agent,
                "policy_version": next((v for v in reversed(traj.versions) if v), rec.policy_version),
                "versions": traj.versions,
                "truncated": traj.truncated,
                "created_at": ro.created_at,
            }
            for key, value in row.items():
                out[key].append(value)
    return out


def to_hf_dataset(selection_or_records: Selection | Iterable[TraceRecord]) -> datasets.Dataset:
    """Lay selected traces out as a ``datasets.Dataset``, one row per trajectory.

    Args:
        selection_or_records: a :class:`Selection` or any iterable of :class:`TraceRecord`.

    Returns:
        A dataset with the columns of the module docstring (records without trajectories give no row).

    Raises:
        MissingExtraError: ``datasets`` is not installed.
    """
    records = (
        selection_or_records.records if isinstance(selection_or_records, Selection) else selection_or_records
    )
    return _datasets().Dataset.from_dict(_rows(records), features=hf_features())


def export_hf(
    store: TraceStore,
    path: str | os.PathLike[str],
    flt: TraceFilter = TraceFilter(),
    *,
    selection: Selection | None = None,
) -> ExportReport:
    """Select traces and save them with ``Dataset.save_to_disk``, all or nothing.

    The dataset is saved to a temporary directory next to ``path`` and renamed onto it at the end (an
    existing directory at ``path`` is replaced); on error ``path`` is left absent or unchanged. Load it
    with ``datasets.load_from_disk(path)``.

    Args:
        store: the store to read.
        path: the directory to write; its parent must exist.
        flt: which rollouts (ignored when ``selection`` is given).
        selection: an existing selection to save instead of selecting again.

    Returns:
        Records (rollouts) and rows (trajectories) written, with the selection's skip counts.

    Raises:
        EmptySelectionError: nothing matches, or no selected rollout has a trajectory (nothing written).
        MissingExtraError: ``datasets`` is not installed.
        UserError: the parent directory does not exist.
    """
    selection = selection if selection is not None else select_traces(store, flt)
    dataset = to_hf_dataset(selection)
    if len(dataset) == 0:
        raise EmptySelectionError(
            Selection(
                records=[],
                considered=selection.considered,
                skipped=selection.skipped + Counter({"no llm spans": len(selection.records)}),
                filter=selection.filter,
            )
        )
    target = Path(path)
    with atomic_path(target, directory=True) as tmp:
        dataset.save_to_disk(str(tmp))
    record_export(store, target, "hf", (rec.rollout_id for rec in selection.records))
    return ExportReport(
        target, len(selection.records), len(dataset), selection.considered, Counter(selection.skipped)
    )
