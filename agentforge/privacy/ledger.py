"""What left the store and what was deleted from it, kept in the store itself (through the ``TraceStore``
port, as never-active versions of two resources, like the promotion decision log):

* ``privacy:exports``: one version per export (``replay export``, HF datasets): path, format, time and the
  rollout ids it holds, so a later deletion can list the files that still carry a subject's data;
* ``privacy:deletions``: one version per ``agentforge forget`` or retention run: what kind of subject (its id
  only as a SHA-256 digest), how many rows went, and the exports made before it that held those rollouts.

Neither holds any span text.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from agentforge.errors import AgentForgeError
from agentforge.types import ResourceVersion, Span, now

if TYPE_CHECKING:
    from agentforge.ports import TraceStore

__all__ = [
    "EXPORTS",
    "DELETIONS",
    "record_export",
    "exports_holding",
    "record_deletion",
    "must_stay",
    "digest",
]

logger = logging.getLogger("agentforge.privacy")

EXPORTS = "privacy:exports"
DELETIONS = "privacy:deletions"


def digest(value: str) -> str:
    """The SHA-256 hex digest that stands for a subject id in the deletion log."""
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def must_stay(span: Span) -> bool:
    """Whether the policy that recorded ``span`` says it must not leave the store (exports refuse it):
    ``attributes["privacy"]["exportable"]`` is false."""
    privacy = span.attributes.get("privacy")
    return isinstance(privacy, dict) and privacy.get("exportable") is False


def record_export(
    store: TraceStore, path: str | os.PathLike[str], fmt: str, rollout_ids: Iterable[str]
) -> None:
    """Log one export (call it after the file is written).

    Args:
        store: the store exported from.
        path: the file or directory written (stored as an absolute path).
        fmt: ``"jsonl"`` or ``"hf"``.
        rollout_ids: the rollouts it holds.
    """
    payload = {
        "path": os.path.abspath(os.fspath(path)),
        "format": fmt,
        "rollout_ids": sorted(set(rollout_ids)),
    }
    try:
        store.publish_resource(ResourceVersion(name=EXPORTS, kind="other", payload=payload), activate=False)
    except AgentForgeError as exc:  # e.g. a store server without the admin key: the export itself stands
        logger.warning("export %s not logged in the store (%s): forget cannot list it", payload["path"], exc)


def exports_holding(store: TraceStore, rollout_ids: Iterable[str], before: float) -> list[dict[str, Any]]:
    """Exports logged before ``before`` (seconds since the epoch) that hold any of ``rollout_ids``.

    Returns:
        ``{"path", "format", "created_at", "rollouts"}`` per export (``rollouts``: how many of the given ones).
    """
    wanted = set(rollout_ids)
    out = []
    for version in store.list_resources(EXPORTS):
        held = wanted.intersection(version.payload.get("rollout_ids") or ())
        if version.created_at <= before and held:
            out.append(
                {
                    "path": version.payload.get("path"),
                    "format": version.payload.get("format"),
                    "created_at": version.created_at,
                    "rollouts": len(held),
                }
            )
    return out


def record_deletion(
    store: TraceStore,
    subject: str,
    values: Sequence[str],
    counts: dict[str, int],
    exports: list[dict[str, Any]],
) -> ResourceVersion:
    """Log one deletion without its data.

    Args:
        store: the store deleted from.
        subject: ``"rollout"``, ``"session"``, ``"user"`` or ``"retention"``.
        values: the subject ids (stored as :func:`digest` s) or, for retention, the cut-off as text.
        counts: rows deleted per table.
        exports: :func:`exports_holding` of the deleted rollouts.

    Returns:
        The stored log entry.
    """
    payload = {
        "subject": subject,
        "subject_sha256": [digest(v) for v in values] if subject != "retention" else [],
        "cutoff": values[0] if subject == "retention" and values else None,
        "deleted": counts,
        "exports_before": exports,
        "at": now(),
    }
    return store.publish_resource(
        ResourceVersion(name=DELETIONS, kind="other", payload=payload), activate=False
    )
