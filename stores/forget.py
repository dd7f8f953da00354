"""Deleting a subject's data from a SQL store (``agentforge forget``) and raw traces past a retention age.

A subject is a rollout id, a session or a user: a rollout belongs to session ``S`` / user ``U`` when its
``session_id`` / ``user_id`` is ``S`` / ``U`` (:class:`~agentforge.types.Rollout`: set by the application that
knows the person, when it enqueues the rollout). Metadata and task fields never decide: clients write them, and
one who put another person's id there would have had that person's deletion steered to her own rollout (issue
36). Rollouts that name a subject only there are counted (:attr:`ForgetReport.named_in_metadata`) and kept, so
the operator can look at them (``--rollout`` deletes one). Deleting a
rollout deletes its spans (the messages, tool results and token ids they hold), rewards and attempts, and the
rollout row (its task). Samples are derived from these rows on read (:mod:`agentforge.trainers.samples`), so
none outlive them; files exported earlier are listed, not touched.

Freed space is erased too: on SQLite the delete runs with ``PRAGMA secure_delete`` (freed pages are zeroed),
then ``VACUUM`` rewrites the file and ``wal_checkpoint(TRUNCATE)`` empties the WAL; on PostgreSQL ``VACUUM``
(by default ``VACUUM FULL``, which rewrites the tables under an exclusive lock: a plain ``VACUUM`` only marks the
dead rows' space reusable and leaves their text readable in the table files; ``full=False`` for that) with
``ANALYZE`` (so the planner statistics in ``pg_statistic`` hold no sampled value of a deleted row; a table left
empty has its column statistics dropped) and a ``CHECKPOINT`` follow. The WAL segments written before then hold
the deleted text too (the rows as inserted, and full-page images of the pages the delete changed): ``forget``
switches to a new segment and checkpoints again, so the server removes every older segment — where the server
lets it (:func:`_wal_residue`: a role granted ``pg_checkpoint`` and ``EXECUTE`` on ``pg_switch_wal``; with
``wal_recycle = off``, since a recycled segment is renamed for reuse with its bytes intact; no archiving, no
``wal_keep_size``, no replication slot). What stops it is reported (:attr:`ForgetReport.residue`), not hidden.

Each run is logged without its data (:mod:`agentforge.privacy.ledger`). Deleting twice is harmless: the second
run finds nothing and logs a deletion of zero rows.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import CursorResult, delete, or_, text
from sqlalchemy.engine import make_url
from sqlmodel import Session, col, select

from agentforge.errors import UserError
from agentforge.privacy.ledger import exports_holding, record_deletion
from agentforge.stores.sql import SQLStore
from agentforge.stores.tables import AttemptRow, RewardRow, RolloutRow, SpanRow
from agentforge.types import ResourceVersion

__all__ = ["ForgetReport", "forget", "apply_retention", "RETAINED_METRICS", "SUBJECT_KEYS"]

#: each subject kind's column of a rollout (the keys that name it in client-written metadata: SUBJECT_HINTS)
SUBJECT_KEYS = {"session": "session_id", "user": "user_id"}
SUBJECT_HINTS = {"session": ("session_id", "session"), "user": ("user_id", "user")}
#: the resource whose versions keep the aggregates of rollouts deleted by retention
RETAINED_METRICS = "metrics:retained"
_TERMINAL = ("succeeded", "failed", "cancelled")
_CHUNK = 500


@dataclass
class ForgetReport:
    """What one deletion did.

    Attributes:
        rollout_ids: the rollouts deleted.
        deleted: rows deleted per table (``rollouts``, ``attempts``, ``spans``, ``rewards``).
        exports_before: exported files made earlier that hold some of those rollouts (still on disk).
        named_in_metadata: rollouts not deleted that name one of the sessions or users only in fields
            clients write (metadata, task input or metadata: ``session_id``, ``user_id``, ``user``).
        residue: where the deleted text may still be readable on the database server after the run, each with
            the setting that would erase it (empty: nowhere that the store can see).
    """

    rollout_ids: list[str] = field(default_factory=list)
    deleted: dict[str, int] = field(default_factory=dict)
    exports_before: list[dict[str, Any]] = field(default_factory=list)
    named_in_metadata: list[str] = field(default_factory=list)
    residue: list[str] = field(default_factory=list)


def _owner_values(row: RolloutRow, keys: Sequence[str]) -> set[str]:
    values = set()
    for raw, path in ((row.metadata_json, ()), (row.task_json, ("input",)), (row.task_json, ("metadata",))):
        try:
            obj = json.loads(raw) if raw else {}
        except ValueError:
            continue
        for step in path:
            obj = obj.get(step) if isinstance(obj, dict) else None
        if isinstance(obj, dict):
            values.update(obj[k] for k in keys if isinstance(obj.get(k), str))
    return values


def _rollouts_where(s: Session, column: Any, values: Sequence[str]) -> list[str]:
    """The ids of the rollouts whose ``column`` is one of ``values`` (indexed; ``IN`` lists of :data:`_CHUNK`)."""
    found: list[str] = []
    for at in range(0, len(values), _CHUNK):
        found += s.exec(select(RolloutRow.rollout_id).where(column.in_(values[at : at + _CHUNK]))).all()
    return found


def _existing_rollouts(s: Session, values: Sequence[str]) -> list[str]:
    """The ids in ``values`` that name a stored rollout, in their order (a missing id deletes nothing)."""
    found = set(_rollouts_where(s, col(RolloutRow.rollout_id), values))
    return [v for v in values if v in found]


def _subject_rollouts(s: Session, kind: str, values: Sequence[str]) -> list[str]:
    """The rollouts whose ``session_id`` / ``user_id`` column is one of ``values``."""
    return _rollouts_where(s, getattr(RolloutRow, SUBJECT_KEYS[kind]), values)


def _named_in_metadata(s: Session, kind: str, values: Sequence[str]) -> list[str]:
    """Rollouts that name one of ``values`` in client-written fields (see :attr:`ForgetReport.named_in_metadata`)."""
    found = []
    for value in values:
        needle = json.dumps(value)[1:-1]  # how the value reads inside the stored JSON
        rows = s.exec(
            select(RolloutRow).where(
                or_(
                    col(RolloutRow.metadata_json).contains(needle, autoescape=True),
                    col(RolloutRow.task_json).contains(needle, autoescape=True),
                )
            )
        ).all()
        found += [r.rollout_id for r in rows if value in _owner_values(r, SUBJECT_HINTS[kind])]
    return found


def _delete(s: Session, ids: list[str]) -> dict[str, int]:
    if s.get_bind().dialect.name == "sqlite":
        s.execute(text("PRAGMA secure_delete = ON"))  # freed pages are zeroed, not left readable
    counts: dict[str, int] = dict.fromkeys(("spans", "rewards", "attempts", "rollouts"), 0)
    for at in range(0, len(ids), _CHUNK):
        chunk = ids[at : at + _CHUNK]
        for name, table in (
            ("spans", SpanRow),
            ("rewards", RewardRow),
            ("attempts", AttemptRow),
            ("rollouts", RolloutRow),
        ):
            result = cast(
                "CursorResult[Any]", s.execute(delete(table).where(col(table.rollout_id).in_(chunk)))
            )
            counts[name] += result.rowcount or 0
    return counts


def _erase_freed(store: SQLStore, full: bool) -> list[str]:
    """Erase the space the delete freed; returns :attr:`ForgetReport.residue`."""
    if store.dialect == "sqlite":
        if store.url in ("sqlite://", "sqlite:///:memory:"):
            return []
        # a connection of its own, outside SQLAlchemy's transaction handling (VACUUM refuses any transaction)
        conn = sqlite3.connect(make_url(store.url).database or "", isolation_level=None, timeout=30)
        try:
            conn.execute("PRAGMA secure_delete = ON")
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        return []
    residue = [] if full else [_PLAIN_VACUUM]
    with store._tx.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        verb = "VACUUM (FULL, ANALYZE)" if full else "VACUUM (ANALYZE)"
        for table in ("af_spans", "af_rewards", "af_attempts", "af_rollouts"):
            conn.exec_driver_sql(f"{verb} {table}")
            if conn.exec_driver_sql(f"SELECT NOT EXISTS (SELECT 1 FROM {table})").scalar():
                _drop_statistics(conn, table)
        return residue + _wal_residue(conn)


_NOT_ERASED = (
    "freed space: not erased (--no-vacuum): the deleted text stays in the database files until reused"
)
_PLAIN_VACUUM = (
    "table files: a plain VACUUM (--no-full) leaves the deleted rows' text there until the space is reused"
)


def _wal_residue(conn: Any) -> list[str]:
    """Checkpoint, switch to a new WAL segment and checkpoint again, so PostgreSQL removes the segments that hold
    the deleted rows (as inserted, and in the full-page images the delete wrote); say what keeps any of them.

    A checkpoint removes the segments before its redo point (PostgreSQL's ``RemoveOldXlogFiles``), unless
    ``wal_recycle`` renames them for reuse (bytes intact until overwritten), ``archive_mode`` copies them away,
    ``wal_keep_size`` or a replication slot keeps them. ``CHECKPOINT`` needs ``pg_checkpoint`` (PostgreSQL 15)
    or a superuser, ``pg_switch_wal()`` an ``EXECUTE`` grant or a superuser.

    Returns:
        One line per cause that may leave the text in WAL files, each naming the setting that removes it.
    """
    residue: list[str] = []
    try:
        conn.exec_driver_sql("CHECKPOINT")
        conn.exec_driver_sql("SELECT pg_switch_wal()")
        conn.exec_driver_sql("CHECKPOINT")
    except Exception:  # noqa: BLE001 - a role without the rights: the server's own checkpoints follow later
        role = conn.exec_driver_sql("SELECT current_user").scalar()
        residue.append(
            "WAL: this role may not checkpoint or switch WAL segments, so the segments holding the text stay "
            f"until the server's own checkpoints (GRANT pg_checkpoint TO {role}; GRANT EXECUTE ON FUNCTION "
            f"pg_switch_wal() TO {role})"
        )

    def setting(name: str) -> str:
        return str(conn.exec_driver_sql("SELECT current_setting(%(n)s)", {"n": name}).scalar())

    if setting("wal_recycle") == "on":
        residue.append(
            "WAL: wal_recycle = on renames old segments for reuse with their bytes intact until overwritten "
            "(ALTER SYSTEM SET wal_recycle = off)"
        )
    if setting("archive_mode") != "off":
        residue.append(
            "WAL: archive_mode is on: the archived segments hold the text (the archive's retention)"
        )
    if setting("wal_keep_size") not in ("0", "0MB"):
        residue.append(f"WAL: wal_keep_size = {setting('wal_keep_size')} keeps old segments (set it to 0)")
    slots = conn.exec_driver_sql("SELECT count(*) FROM pg_replication_slots").scalar()
    if slots:
        residue.append(
            f"WAL: {slots} replication slot(s) keep old segments until their consumers read them (and a "
            "replica holds its own copy of the rows)"
        )
    return residue


def _drop_statistics(conn: Any, table: str) -> None:
    """Drop the planner statistics of an emptied PostgreSQL ``table``'s columns.

    ``ANALYZE`` (run with the vacuum) replaces the sampled values in ``pg_statistic`` (most common values,
    histogram bounds: identities among them) with ones drawn from the rows left, but on an empty table it writes
    nothing and the old values stay. Deleting ``pg_statistic`` rows needs a superuser; ``ALTER COLUMN ... TYPE``
    to the column's own type drops them for the table's owner (PostgreSQL's ``ATExecAlterColumnType`` calls
    ``RemoveStatistics``), rewriting nothing on an empty table.
    """
    rows = conn.exec_driver_sql(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "JOIN pg_stats s ON s.attname = a.attname AND s.tablename = %(t)s AND s.schemaname = current_schema() "
        "WHERE a.attrelid = to_regclass(%(t)s) AND a.attnum > 0 AND NOT a.attisdropped",
        {"t": table},
    ).all()
    if rows:
        columns = ", ".join(f'ALTER COLUMN "{name}" TYPE {kind}' for name, kind in rows)
        conn.exec_driver_sql(f"ALTER TABLE {table} {columns}")


def forget(
    store: SQLStore,
    *,
    rollouts: Iterable[str] = (),
    sessions: Iterable[str] = (),
    users: Iterable[str] = (),
    vacuum: bool = True,
    full: bool = True,
) -> ForgetReport:
    """Delete every row of the given subjects and log the deletion (see the module docstring).

    Args:
        store: a SQLite or PostgreSQL store.
        rollouts: rollout ids.
        sessions: session ids (a rollout's ``session_id``).
        users: user ids (a rollout's ``user_id``).
        vacuum: erase the freed space afterwards (SQLite ``VACUUM``; PostgreSQL ``VACUUM``).
        full: on PostgreSQL, ``VACUUM FULL`` (rewrites the tables; blocks them meanwhile); ``False``: a plain
            ``VACUUM``, which leaves the deleted text readable in the table files until the space is reused.

    Returns:
        The deleted rollouts, row counts, the exports made before that hold them and what may still hold the
        text on the database server (:attr:`ForgetReport.residue`).

    Raises:
        UserError: no subject given.
    """
    rollouts, sessions, users = list(rollouts), list(sessions), list(users)
    if not (rollouts or sessions or users):
        raise UserError("forget needs at least one --rollout, --session or --user")
    started = time.time()

    def run(s: Session) -> tuple[list[str], dict[str, int], list[str]]:
        ids = list(
            dict.fromkeys(
                _existing_rollouts(s, rollouts)
                + _subject_rollouts(s, "session", sessions)
                + _subject_rollouts(s, "user", users)
            )
        )
        hinted = _named_in_metadata(s, "session", sessions) + _named_in_metadata(s, "user", users)
        deleted = set(ids)
        return ids, _delete(s, ids), [r for r in dict.fromkeys(hinted) if r not in deleted]

    ids, counts, named = store._tx.run(run, write=True)
    residue = _erase_freed(store, full) if vacuum else [_NOT_ERASED]
    report = ForgetReport(ids, counts, exports_holding(store, ids, started), named, residue)
    for subject, values in (("rollout", rollouts), ("session", sessions), ("user", users)):
        if values:
            record_deletion(store, subject, values, counts, report.exports_before)
    return report


def apply_retention(
    store: SQLStore, days: float, *, vacuum: bool = True, full: bool = True, at: float | None = None
) -> ForgetReport:
    """Delete finished rollouts created more than ``days`` days ago, and spans recorded without a rollout
    (unattributed calls) that started before then; keep the rollouts' aggregates.

    The aggregates (per UTC day, agent and state: rollouts, rollouts with a valid final reward, the sum and
    mean of those rewards) are stored first as the next version of :data:`RETAINED_METRICS`.

    Args:
        store: a SQLite or PostgreSQL store.
        days: the retention age, days (> 0).
        vacuum: erase the freed space afterwards.
        full: on PostgreSQL, ``VACUUM FULL`` as :func:`forget` does (``False``: a plain ``VACUUM``, which
            leaves the deleted text readable in the table files until the space is reused).
        at: "now", seconds since the epoch (default: the clock).

    Returns:
        What was deleted.

    Raises:
        UserError: ``days`` is not a positive number.
    """
    if not (isinstance(days, int | float) and math.isfinite(days) and days > 0):
        raise UserError(f"retention needs a positive number of days, got {days!r}")
    cutoff = (at if at is not None else time.time()) - days * 86400.0

    def run(s: Session) -> tuple[list[str], dict[str, int], list[dict[str, Any]]]:
        rows = s.exec(
            select(RolloutRow.rollout_id, RolloutRow.agent, RolloutRow.state, RolloutRow.created_at).where(
                col(RolloutRow.created_at) < cutoff,
                col(RolloutRow.state).in_(_TERMINAL),
            )
        ).all()
        ids = [r[0] for r in rows]
        finals: dict[str, float | None] = {}
        for at_ in range(0, len(ids), _CHUNK):
            chunk = ids[at_ : at_ + _CHUNK]
            for rid, value in s.exec(
                select(RewardRow.rollout_id, RewardRow.value).where(
                    col(RewardRow.rollout_id).in_(chunk),
                    col(RewardRow.final),
                    col(RewardRow.valid),
                )
            ).all():
                finals[rid] = value
        groups: dict[tuple[str, str, str], list[Any]] = {}
        for rid, agent, state, created in rows:
            day = time.strftime("%Y-%m-%d", time.gmtime(created))
            g = groups.setdefault((day, agent, state), [0, 0, 0.0])
            g[0] += 1
            if rid in finals and finals[rid] is not None:
                g[1] += 1
                g[2] += finals[rid]
        aggregates = [
            {
                "day": d,
                "agent": a,
                "state": st,
                "rollouts": n,
                "rewarded": k,
                "reward_sum": total,
                "reward_mean": total / k if k else None,
            }
            for (d, a, st), (n, k, total) in sorted(groups.items())
        ]
        counts = _delete(s, ids)
        orphans = cast(  # spans recorded without a rollout (unattributed calls) age out too
            "CursorResult[Any]",
            s.execute(
                delete(SpanRow).where(col(SpanRow.rollout_id).is_(None), col(SpanRow.started_at) < cutoff)
            ),
        )
        counts["orphan_spans"] = orphans.rowcount or 0
        return ids, counts, aggregates

    ids, counts, aggregates = store._tx.run(run, write=True)
    if aggregates:
        payload = {"cutoff": cutoff, "days": days, "aggregates": aggregates}
        store.publish_resource(
            ResourceVersion(name=RETAINED_METRICS, kind="other", payload=payload), activate=False
        )
    residue: list[str] = []
    if ids or counts["orphan_spans"]:
        residue = _erase_freed(store, full) if vacuum else [_NOT_ERASED]
    report = ForgetReport(ids, counts, exports_holding(store, ids, cutoff + days * 86400.0), residue=residue)
    record_deletion(store, "retention", [str(cutoff)], counts, report.exports_before)
    return report
