"""Batched span and reward writes of the SQL store: many items, one transaction, bulk inserts.

:func:`write_items` is what :meth:`SQLStore.write_batch <agentforge.stores.sql.SQLStore.write_batch>`
runs inside one write transaction. It keeps the single-item rules of ``add_span`` / ``add_reward``
exactly (idempotent ids, attempt stamping, the reward attachment rule, one store-wide sequence) but
looks up what a run of consecutive spans needs with a few ``IN`` queries and inserts the run with one
``executemany`` (SQLite) or one ``COPY`` (PostgreSQL), so the cost per span is a row, not a transaction.

Items are applied in order: a reward sees every span before it in the batch. An item the store rejects
(``NotFoundError``, ``UserError``) gets its error in its result slot and writes nothing; the others are
written. Database errors propagate, so the transaction runner retries the whole batch.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence
from typing import Any, NamedTuple

from pydantic_core import PydanticSerializationError
from sqlmodel import Session, col, select

from agentforge.errors import AgentForgeError, NotFoundError, UserError
from agentforge.stores.codec import loads, stamped
from agentforge.stores.engine import attempt_row, rollout_row, running_attempt_id
from agentforge.stores.sql_cursor import BatchCursor
from agentforge.stores.tables import (
    SPAN_CELLS,
    SPAN_JSON_CELLS,
    RewardRow,
    SpanRow,
    reward_to_row,
    row_to_reward,
    row_to_span,
    span_cells,
)
from agentforge.types import LATE_FINAL, TRAINED_STEP, AttemptState, Reward, RolloutState, Span, SpanKind

__all__ = [
    "write_items",
    "write_spans",
    "Prepared",
    "prepare_span",
    "next_seqs",
    "insert_reward",
    "late_marks",
    "is_late",
    "LATE",
]

Item = Span | Reward
Result = Span | Reward | AgentForgeError

_SPAN_FIELDS = tuple(SpanRow.__table__.columns.keys())  # type: ignore[attr-defined]  # sqlmodel's types omit __table__
_SPAN_COLUMNS = ", ".join(_SPAN_FIELDS)
#: The bulk insert's columns: the three the store stamps, then the span's own cells (:func:`span_cells`).
_INSERT_FIELDS = ("seq", "rollout_id", "attempt_id", *SPAN_CELLS)
_INSERT_COLUMNS = ", ".join(_INSERT_FIELDS)
_UTF8_COLUMNS = tuple(3 + i for i in SPAN_JSON_CELLS)  # where in an insert row JSON may come as UTF-8 bytes
_SpanRecord = namedtuple("_SpanRecord", _SPAN_FIELDS)  # a span row, by column name
_RUNNING = AttemptState.running.value
_FINISHED = frozenset(state.value for state in RolloutState if state.finished)  # rollout states, as stored
#: The span attribute marking a span the store quarantined as late (see :func:`late_marks`).
LATE = "late"


class Prepared(NamedTuple):
    """A span serialised ahead of its transaction (:func:`prepare_span`): its row's cells (the values of the
    columns :data:`~agentforge.stores.tables.SPAN_CELLS`), or the error the span alone fails with.
    :func:`write_spans` takes it in place of the span; with ``keep`` false its result is ``None`` once it is
    written (no stored copy is built for a caller that reads none)."""

    span: Span
    cells: tuple[Any, ...] | UserError
    keep: bool = True


def prepare_span(span: Span, keep: bool = True, utf8: bool = False) -> Prepared:
    """Serialise ``span``'s row now (in the caller's thread, while the writer thread waits on the database),
    so the write transaction only stamps it. The cells are what :func:`write_spans` would build itself.

    Args:
        span: the span.
        keep: whether its result is the stored span (``False``: ``None``, errors as usual).
        utf8: JSON columns as UTF-8 bytes (see :func:`~agentforge.stores.tables.span_cells`): only for a
            SQLite store (PostgreSQL's ``COPY`` would write bytes as ``bytea``).
    """
    return Prepared(span, _cells(span, utf8), keep)


def _cells(span: Span, utf8: bool = False) -> tuple[Any, ...] | UserError:
    try:
        return span_cells(span, utf8)
    except UserError as exc:
        return exc
    except (PydanticSerializationError, TypeError, ValueError) as exc:  # fails alone, not the batch
        return UserError(f"span {span.span_id!r} cannot be stored as JSON: {exc}")


def next_seqs(s: Session, n: int) -> list[int]:
    """Take ``n`` store-wide sequence numbers (shared by spans and rewards), increasing.

    PostgreSQL: ``n`` values of the ``af_sequence`` table's own sequence in one query; SQLite (inside the
    write lock that every write transaction takes up front): advance the ``AUTOINCREMENT`` counter by
    ``n`` in ``sqlite_sequence`` with one ``UPDATE ... RETURNING`` (the very first time, with one ticket row
    inserted at ``n`` and deleted again, which creates the counter).
    """
    return BatchCursor.of(s).next_seqs(n)


def write_items(s: Session, items: Sequence[Item]) -> list[Result]:
    """Write ``items`` in order inside the open transaction of ``s`` (see the module docstring).

    Returns:
        One entry per item: the stored span/reward (the existing one for a known id) or the
        ``AgentForgeError`` that item failed with.
    """
    results: list[Result] = []
    run: list[Span] = []
    for item in items:
        if isinstance(item, Span):
            run.append(item)
            continue
        if run:
            results.extend(_insert_spans(BatchCursor.of(s), run))
            run = []
        try:
            results.append(insert_reward(s, item))
        except AgentForgeError as exc:
            results.append(exc)
    if run:
        results.extend(_insert_spans(BatchCursor.of(s), run))
    return results


def write_spans(connection: Any, dialect: Any, spans: Sequence[Span | Prepared]) -> list[Result]:
    """:func:`write_items` for a batch of spans only (or spans :func:`prepare_span` serialised already), on a
    driver connection inside an open transaction (:meth:`~agentforge.stores.engine.Transactor.run_raw`):
    the group-commit writer's usual batch."""
    return _insert_spans(BatchCursor(connection, dialect), list(spans))


def _insert_spans(cur: BatchCursor, items: Sequence[Span | Prepared]) -> list[Result]:
    """Insert a run of spans with one lookup per kind and one bulk insert (``COPY`` on PostgreSQL)."""
    results: list[Result | None] = []
    spans: list[Span] = []
    cells: list[tuple[Any, ...] | UserError] = []
    keep: list[bool] = []  # False: the caller reads no stored copy, its result is None
    for item in items:  # serialise (and check scalar text) before touching the database
        if type(item) is Prepared:
            span, row, kept = item
        else:
            span, row, kept = item, _cells(item, not cur.postgres), True  # type: ignore[assignment]
        spans.append(span)  # type: ignore[arg-type]
        cells.append(row)
        keep.append(kept)
        results.append(row if type(row) is UserError else None)
    valid = [sp for sp, r in zip(spans, results, strict=True) if r is None]
    # the driver's own cursor on the hot path: no ORM, no compilation, no row objects; on SQLite the lookups
    # and the sequence's counter come back in one statement (BatchCursor.lookups)
    span_ids = list({sp.span_id for sp in valid})
    attempt_ids = sorted({sp.attempt_id for sp in valid if sp.attempt_id is not None})
    rollout_ids = sorted({sp.rollout_id for sp in valid if sp.rollout_id is not None})
    specs = [
        ("span_id", "FROM af_spans WHERE span_id {in_ids}", span_ids),
        ("attempt_id, rollout_id, state", "FROM af_attempts WHERE attempt_id {in_ids}", attempt_ids),
        (_ROLLOUT_COLUMNS, _rollout_source(cur), rollout_ids),
    ]
    (found, attempt_rows, rollout_rows), top = cur.lookups(specs, sequence=True)
    existing: dict[str, Span] = {}
    if found:  # ids stored before (a retried flush): their whole rows, for their callers' results
        for row in cur.rows_in(
            _SPAN_COLUMNS, "FROM af_spans WHERE span_id {in_ids}", [span_id for (span_id,) in found]
        ):
            record = _SpanRecord(*row)
            existing[record.span_id] = row_to_span(record)  # type: ignore[arg-type]
    attempts: dict[str, str] = {}  # attempt id -> rollout id
    attempt_states: dict[str, str] = {}  # attempt id -> its state
    for a, r, state in attempt_rows:
        attempts[a], attempt_states[a] = r, state
    others = sorted(set(attempts.values()).difference(rollout_ids))  # rollouts named by their attempts only
    if others:
        rollout_rows += cur.rows_in(_ROLLOUT_COLUMNS, _rollout_source(cur), others, packed=True)
    rollouts: dict[str, tuple[str, int]] = {}  # rollout id -> (state, attempts)
    running: dict[str, tuple[int, str]] = {}  # rollout id -> (number, attempt id) of its running attempt
    for rollout_id, rollout_state, tries, number, attempt_id, state in rollout_rows:
        rollouts[rollout_id] = (rollout_state, tries)
        if state == _RUNNING and (rollout_id not in running or number > running[rollout_id][0]):
            running[rollout_id] = (number, attempt_id)

    pending: list[tuple[int, str | None, str | None]] = []  # (index, stored rollout id, attempt id)
    taken: dict[str, int] = {}  # span id -> index of its first occurrence in this run
    repeated = False
    for i, span in enumerate(spans):
        if results[i] is not None:
            continue
        if span.span_id in existing:
            results[i] = existing[span.span_id] if keep[i] else None
            continue
        if span.span_id in taken:
            repeated = True  # a duplicate inside the batch: resolved below to the first occurrence's result
            continue
        try:
            rollout_id, attempt_id = _stamp(span, attempts, rollouts, running)
        except AgentForgeError as exc:
            results[i] = exc
            continue
        why = _late(span, rollout_id, attempt_id, attempt_states, rollouts)
        if why is not None:  # quarantined: stored and listed, never part of the rollout's valid spans
            spans[i] = span = span.model_copy(update={"attributes": {**span.attributes, **late_marks(why)}})
            cells[i] = span_cells(span, not cur.postgres)
        taken[span.span_id] = i
        pending.append((i, rollout_id, attempt_id))
    if pending:
        values: list[Any] = []  # the rows one after the other, in _INSERT_FIELDS order
        for (i, rollout_id, attempt_id), seq in zip(pending, cur.next_seqs(len(pending), top), strict=True):
            values += (seq, rollout_id, attempt_id)
            values += cells[i]  # type: ignore[arg-type]
            if keep[i]:
                results[i] = stamped(
                    spans[i], {"sequence": seq, "rollout_id": rollout_id, "attempt_id": attempt_id}
                )
        cur.insert_rows("af_spans", _INSERT_COLUMNS, len(_INSERT_FIELDS), values, _UTF8_COLUMNS)
    if repeated:
        for i, span in enumerate(spans):
            first = taken.get(span.span_id, i)
            if first != i:  # a duplicate id later in the batch: the first occurrence's result
                results[i] = results[first]
    return results  # type: ignore[return-value]


_ROLLOUT_COLUMNS = "r.rollout_id, r.state, r.attempts, a.number, a.attempt_id, a.state"


def _rollout_source(cur: BatchCursor) -> str:
    """Each rollout with its attempts (a few each), in one query on the rollout_id indexes; on PostgreSQL read
    ``FOR SHARE``, so a concurrent ``finish_attempt`` waits for the batch (or the batch sees it): see :func:`_late`."""
    source = "FROM af_rollouts r LEFT OUTER JOIN af_attempts a ON a.rollout_id = r.rollout_id WHERE r.rollout_id {in_ids}"
    return source + " FOR SHARE OF r" if cur.postgres else source


def late_marks(why: str) -> dict[str, Any]:
    """The attributes that quarantine a late span: ``{"late": True, "late_reason": why}``."""
    return {LATE: True, "late_reason": why}


def is_late(span: Span) -> bool:
    """Whether the store quarantined ``span`` as late (see :func:`_late`)."""
    return span.attributes.get(LATE) is True


def _late(
    span: Span,
    rollout_id: str | None,
    attempt_id: str | None,
    attempt_states: dict[str, str],
    rollouts: dict[str, tuple[str, int]],
) -> str | None:
    """Why ``span`` arrives late for its rollout, or ``None`` when it does not.

    An LLM span is late when its rollout is finished (succeeded, failed, timed out, cancelled), when the
    attempt it names is no longer running, or when it names no attempt while its rollout has had attempts
    but runs none (a call of an ended attempt between retries). Such a span is stored with
    :func:`late_marks` (visible, attributable) and ``list_spans(valid_only=True)`` leaves it out, so a late
    call never rewrites a rollout's training data (DESIGN fact 8). On PostgreSQL the rollout rows are read
    ``FOR SHARE``, so a ``finish_attempt`` committing meanwhile is ordered before or after the whole batch.
    Tool and custom spans are never late: an annotation after the end (a feedback form) is not a call.
    """
    if rollout_id is None or span.kind != SpanKind.llm:
        return None
    state, tries = rollouts[rollout_id]
    if state in _FINISHED:
        return f"rollout {rollout_id!r} already {state}"
    if span.attempt_id is not None and attempt_states.get(span.attempt_id) != _RUNNING:
        return f"attempt {span.attempt_id!r} already {attempt_states.get(span.attempt_id)}"
    if attempt_id is None and tries > 0:
        return f"rollout {rollout_id!r} is {state} with no running attempt"
    return None


def _stamp(
    span: Span,
    attempts: dict[str, str],
    rollouts: dict[str, tuple[str, int]],
    running: dict[str, tuple[int, str]],
) -> tuple[str | None, str | None]:
    """``(rollout_id, attempt_id)`` as stored: rollout found from its attempt, attempt defaulted to the
    running one.

    Raises:
        NotFoundError: unknown rollout or attempt.
        UserError: the attempt belongs to another rollout.
    """
    rollout_id, attempt_id = span.rollout_id, span.attempt_id
    if attempt_id is not None and attempt_id not in attempts:
        raise NotFoundError(f"attempt {attempt_id!r} does not exist")
    if rollout_id is None and attempt_id is not None:
        rollout_id = attempts[attempt_id]
    if rollout_id is not None:
        if rollout_id not in rollouts:
            raise NotFoundError(f"rollout {rollout_id!r} does not exist")
        if attempt_id is None:
            attempt_id = running[rollout_id][1] if rollout_id in running else None
        elif attempts[attempt_id] != rollout_id:
            raise UserError(
                f"attempt {attempt_id!r} belongs to rollout {attempts[attempt_id]!r}, not {rollout_id!r}"
            )
    return rollout_id, attempt_id


def _resolve_attempt(s: Session, rollout_id: str, attempt_id: str | None) -> str | None:
    """Check ``attempt_id`` belongs to the rollout, or default it to the running attempt."""
    if attempt_id is None:
        return running_attempt_id(s, rollout_id)
    att = attempt_row(s, attempt_id)
    if att.rollout_id != rollout_id:
        raise UserError(f"attempt {attempt_id!r} belongs to rollout {att.rollout_id!r}, not {rollout_id!r}")
    return attempt_id


def insert_reward(s: Session, reward: Reward) -> Reward:
    """Insert one reward by the attachment rule of :class:`~agentforge.types.Reward` (idempotent by id).

    Returns:
        The stored reward with ``span_id``, ``attempt_id`` and ``sequence`` filled in.

    Raises:
        NotFoundError: unknown rollout, attempt or span.
        UserError: the span/attempt belongs to another rollout; bad text in a scalar field.
    """
    try:
        reward_to_row(reward, 0)  # scalar text and JSON checks before touching the database
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise UserError(f"reward {reward.reward_id!r} cannot be stored as JSON: {exc}") from None
    existing = s.exec(select(RewardRow).where(RewardRow.reward_id == reward.reward_id)).first()
    if existing is not None:
        return row_to_reward(existing)
    trained_step = (loads(rollout_row(s, reward.rollout_id).metadata_json) or {}).get(TRAINED_STEP)
    if reward.final and trained_step is not None:  # the training reward is frozen once a step trained on it
        reward = reward.model_copy(
            update={
                "final": False,
                "metadata": {**reward.metadata, LATE_FINAL: True, TRAINED_STEP: trained_step},
            }
        )
    attempt_id = _resolve_attempt(s, reward.rollout_id, reward.attempt_id)
    span: Any
    if reward.span_id is not None:
        span = s.exec(select(SpanRow).where(SpanRow.span_id == reward.span_id)).first()
        if span is None:
            raise NotFoundError(f"span {reward.span_id!r} does not exist")
        if span.rollout_id != reward.rollout_id:
            raise UserError(
                f"span {reward.span_id!r} belongs to rollout {span.rollout_id!r}, not {reward.rollout_id!r}"
            )
    else:
        q = select(SpanRow).where(SpanRow.rollout_id == reward.rollout_id).order_by(col(SpanRow.seq).desc())
        span = s.exec(q.limit(1)).first()
    if attempt_id is None and span is not None:
        attempt_id = span.attempt_id
    stored = reward.model_copy(update={"span_id": span.span_id if span else None, "attempt_id": attempt_id})
    row = reward_to_row(stored, next_seqs(s, 1)[0])
    s.add(row)
    s.flush()
    return row_to_reward(row)
