"""SQLModel tables of the SQL trace store and their conversion to and from the pydantic types.

The schema is portable (SQLite and PostgreSQL alike): ids and short scalars are ``VARCHAR``, floats
are ``FLOAT``, and every structured field (task input, attributes, the LLM call record, metadata,
payloads) is a ``TEXT`` column holding JSON: ASCII-escaped by :func:`dumps`, or, on the span hot path
(LLM call records and span attributes), UTF-8 JSON by :func:`fast_dumps`, which escapes ``NUL`` and
falls back to :func:`dumps` for text UTF-8 cannot carry.

The text policy and the JSON/text helpers live in :mod:`agentforge.stores.codec` (re-exported here).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, cast

from pydantic import ValidationError
from sqlalchemy import BigInteger, Column, Connection, Integer, Row, Text, UniqueConstraint, inspect, text
from sqlmodel import Field, SQLModel

from agentforge.errors import UserError
from agentforge.stores.codec import ID_PATTERN, dumps, fast_dumps, fast_json, ident, loads, plain
from agentforge.types import (
    Attempt,
    AttemptState,
    LLMCall,
    ResourceKind,
    ResourceVersion,
    Reward,
    Rollout,
    RolloutState,
    Span,
    SpanKind,
    SpanStatus,
    Task,
    check_tenant,
)

__all__ = [
    "ADDED_COLUMNS",
    "add_missing_columns",
    "RolloutRow",
    "AttemptRow",
    "SpanRow",
    "RewardRow",
    "ResourceRow",
    "SequenceTicket",
    "dumps",
    "fast_json",
    "fast_dumps",
    "loads",
    "plain",
    "ident",
    "ID_PATTERN",
    "rollout_to_row",
    "row_to_rollout",
    "attempt_to_row",
    "row_to_attempt",
    "span_values",
    "span_cells",
    "SPAN_CELLS",
    "SPAN_JSON_CELLS",
    "span_to_row",
    "row_to_span",
    "reward_to_row",
    "row_to_reward",
    "resource_to_row",
    "row_to_resource",
]


#: 64-bit ids on PostgreSQL; plain ``INTEGER`` on SQLite, where only that spelling is the rowid alias.
_BIGINT = BigInteger().with_variant(Integer(), "sqlite")


def _json_col() -> Any:
    return Field(default=None, sa_column=Column(Text, nullable=True))


class RolloutRow(SQLModel, table=True):
    """One rollout; ``seq`` (insertion order) makes "oldest first" exact."""

    __tablename__: ClassVar[str] = "af_rollouts"

    seq: int | None = Field(default=None, primary_key=True, sa_type=_BIGINT)
    rollout_id: str = Field(unique=True, index=True, max_length=200)
    task_json: str | None = _json_col()
    state: str = Field(index=True, max_length=20)
    agent: str = Field(default="", index=True)
    group_id: str | None = Field(default=None, index=True)
    resources_json: str | None = _json_col()
    metadata_json: str | None = _json_col()
    attempts: int = 0
    max_attempts: int = 3
    timeout_s: float = 600.0
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: float = Field(index=True)
    updated_at: float
    tenant: str | None = Field(default=None, index=True, max_length=63)
    user_id: str | None = Field(default=None, index=True, max_length=200)
    session_id: str | None = Field(default=None, index=True, max_length=200)


class AttemptRow(SQLModel, table=True):
    """One attempt at a rollout; ``(rollout_id, number)`` is unique."""

    __tablename__: ClassVar[str] = "af_attempts"
    __table_args__ = (UniqueConstraint("rollout_id", "number"),)

    attempt_id: str = Field(primary_key=True, max_length=200)
    rollout_id: str = Field(index=True, max_length=200)
    number: int
    worker_id: str = ""
    state: str = Field(index=True, max_length=20)
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    started_at: float
    heartbeat_at: float
    ended_at: float | None = None


class SequenceTicket(SQLModel, table=True):
    """Source of the store-wide sequence shared by spans and rewards (rows are deleted once taken;
    ``AUTOINCREMENT`` on SQLite and a sequence on PostgreSQL guarantee no number is handed out twice)."""

    __tablename__: ClassVar[str] = "af_sequence"
    __table_args__ = {"sqlite_autoincrement": True}

    seq: int | None = Field(default=None, primary_key=True, sa_type=_BIGINT)
    taken_at: float = 0.0


class SpanRow(SQLModel, table=True):
    """One span; ``seq`` is the store-wide sequence number assigned on insert.

    On SQLite ``seq`` is the rowid (``INTEGER PRIMARY KEY``), so rows lie in sequence order and an insert
    touches one B-tree fewer; files made before this keep a ``BIGINT`` key with its own index, which works
    the same, only slower.

    ``attempt_id`` has no index: ``list_spans`` finds an attempt's spans through its rollout's index, and each
    insert writes one index entry fewer (older tables keep theirs, written in vain)."""

    __tablename__: ClassVar[str] = "af_spans"

    seq: int = Field(primary_key=True, sa_type=_BIGINT, sa_column_kwargs={"autoincrement": False})
    span_id: str = Field(unique=True, index=True, max_length=200)
    rollout_id: str | None = Field(default=None, index=True, max_length=200)
    attempt_id: str | None = Field(default=None, max_length=200)
    kind: str = Field(max_length=20)
    name: str = ""
    status: str = Field(default="ok", max_length=10)
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    llm_json: str | None = _json_col()
    attributes_json: str | None = _json_col()
    started_at: float
    ended_at: float | None = None
    tenant: str | None = Field(default=None, max_length=63)


class RewardRow(SQLModel, table=True):
    """One reward (``seq`` as in :class:`SpanRow`); ``value`` is ``NULL`` (and ``valid`` false) for a missing/NaN reward."""

    __tablename__: ClassVar[str] = "af_rewards"

    seq: int = Field(primary_key=True, sa_type=_BIGINT, sa_column_kwargs={"autoincrement": False})
    reward_id: str = Field(unique=True, index=True, max_length=200)
    rollout_id: str = Field(index=True, max_length=200)
    attempt_id: str | None = Field(default=None, max_length=200)
    span_id: str | None = Field(default=None, max_length=200)
    name: str = "reward"
    value: float | None = None
    valid: bool = False
    final: bool = False
    source: str = "agent"
    metadata_json: str | None = _json_col()
    created_at: float
    tenant: str | None = Field(default=None, max_length=63)


class ResourceRow(SQLModel, table=True):
    """One version of a named resource; at most one active version per name (kept by the store)."""

    __tablename__: ClassVar[str] = "af_resources"

    name: str = Field(primary_key=True, max_length=300)
    version: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    kind: str = Field(max_length=20)
    payload_json: str | None = _json_col()
    active: bool = Field(default=False, index=True)
    created_at: float


# --- conversion ---------------------------------------------------------------------------------


def _tenant(tenant: str | None) -> str | None:
    return None if tenant is None else check_tenant(tenant)


def rollout_to_row(r: Rollout) -> RolloutRow:
    """Rollout → row (``seq`` is assigned by the database)."""
    return RolloutRow(
        rollout_id=ident("rollout_id", r.rollout_id),
        task_json=dumps(r.task.model_dump()),
        state=r.state.value,
        agent=plain("agent", r.agent),
        group_id=plain("group_id", r.group_id),
        resources_json=dumps(r.resources),
        metadata_json=dumps(r.metadata),
        attempts=r.attempts,
        max_attempts=r.max_attempts,
        timeout_s=r.timeout_s,
        error=plain("error", r.error),
        created_at=r.created_at,
        updated_at=r.updated_at,
        tenant=_tenant(r.tenant),
        user_id=plain("user_id", r.user_id),
        session_id=plain("session_id", r.session_id),
    )


def row_to_rollout(row: RolloutRow) -> Rollout:
    """Row → Rollout."""
    return Rollout(
        rollout_id=row.rollout_id,
        task=Task.model_validate(loads(row.task_json)),
        state=RolloutState(row.state),
        agent=row.agent,
        group_id=row.group_id,
        resources=loads(row.resources_json) or {},
        metadata=loads(row.metadata_json) or {},
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        timeout_s=row.timeout_s,
        error=row.error,
        created_at=row.created_at,
        updated_at=row.updated_at,
        tenant=row.tenant,
        user_id=row.user_id,
        session_id=row.session_id,
    )


def attempt_to_row(a: Attempt) -> AttemptRow:
    """Attempt → row."""
    return AttemptRow(
        attempt_id=ident("attempt_id", a.attempt_id),
        rollout_id=ident("rollout_id", a.rollout_id),
        number=a.number,
        worker_id=plain("worker_id", a.worker_id),
        state=a.state.value,
        error=plain("error", a.error),
        started_at=a.started_at,
        heartbeat_at=a.heartbeat_at,
        ended_at=a.ended_at,
    )


def row_to_attempt(row: AttemptRow) -> Attempt:
    """Row → Attempt."""
    return Attempt(
        attempt_id=row.attempt_id,
        rollout_id=row.rollout_id,
        number=row.number,
        worker_id=row.worker_id,
        state=AttemptState(row.state),
        error=row.error,
        started_at=row.started_at,
        heartbeat_at=row.heartbeat_at,
        ended_at=row.ended_at,
    )


def _llm_json(llm: LLMCall) -> str:
    """The ``llm_json`` column: :func:`_llm_record` as text."""
    return _llm_record(llm).decode("utf-8")


def _llm_record(llm: LLMCall) -> bytes:
    """The ``llm_json`` column as UTF-8 bytes: the model's fields as :func:`fast_json` writes them (NaN and
    ±Infinity kept, see :class:`LLMCall`), from the model's own field dict without an intermediate
    ``model_dump`` (only tool calls, models themselves, are dumped)."""
    fields = llm.__dict__
    if fields["tool_calls"]:
        fields = {**fields, "tool_calls": [call.model_dump() for call in fields["tool_calls"]]}
    return fast_json(fields)


#: The columns :func:`span_cells` fills, in its order: all but ``seq``, ``rollout_id``, ``attempt_id`` (stamped).
SPAN_CELLS = (
    "span_id",
    "kind",
    "name",
    "status",
    "error",
    "llm_json",
    "attributes_json",
    "started_at",
    "ended_at",
    "tenant",
)
#: The indexes in :data:`SPAN_CELLS` of the JSON columns, which ``span_cells(utf8=True)`` leaves as bytes.
SPAN_JSON_CELLS = (5, 6)


def span_cells(s: Span, utf8: bool = False) -> tuple[Any, ...]:
    """Span → the values of its row's :data:`SPAN_CELLS` columns, in that order (the bulk insert's part of a
    row that does not depend on the store); its ``rollout_id`` and ``attempt_id`` are checked too.

    Args:
        s: the span.
        utf8: leave the JSON columns as the UTF-8 bytes the JSON writer made (not decoded to ``str``), for a
            driver that stores them as text as they are (SQLite's ``CAST(? AS TEXT)``); binding a non-ASCII
            ``str`` costs SQLite's driver an encoding back to UTF-8, about 2 µs for a 1 kB LLM record.

    Raises:
        UserError: a scalar field holds ``NUL`` or a lone surrogate, or an id is not valid.
    """
    span_id = ident("span_id", s.span_id)
    ident("rollout_id", s.rollout_id)
    ident("attempt_id", s.attempt_id)
    llm = None if s.llm is None else _llm_record(s.llm)
    attributes = fast_json(s.attributes)
    if not utf8:
        llm, attributes = (None if llm is None else llm.decode("utf-8")), attributes.decode("utf-8")
    return (
        span_id,
        s.kind.value,
        plain("span name", s.name),
        s.status,
        plain("span error", s.error),
        llm,
        attributes,
        s.started_at,
        s.ended_at,
        None if s.tenant is None else check_tenant(s.tenant),
    )


def span_values(s: Span, seq: int) -> dict[str, Any]:
    """Span → the column values of its row (for bulk inserts), with sequence number ``seq``.

    Raises:
        UserError: a scalar field holds ``NUL`` or a lone surrogate.
    """
    values = dict(zip(SPAN_CELLS, span_cells(s), strict=True))
    return {"seq": seq, "rollout_id": s.rollout_id, "attempt_id": s.attempt_id, **values}


def span_to_row(s: Span, seq: int) -> SpanRow:
    """Span → row with the store-assigned sequence number ``seq``."""
    return SpanRow(**span_values(s, seq))


def _llm_from_json(text: str | None) -> LLMCall | None:
    """The ``llm_json`` column back as an :class:`LLMCall`: parsed and validated in one pass by
    pydantic-core (3× ``json.loads`` + ``model_validate``), or by Python's ``json`` for what only it reads
    (``\\ud800``-style escapes of lone surrogates, as :func:`dumps` writes them)."""
    if text is None:
        return None
    try:
        return LLMCall.model_validate_json(text)
    except ValidationError as exc:
        if not any(e["type"] == "json_invalid" for e in exc.errors()):
            raise
    return LLMCall.model_validate(loads(text))


def row_to_span(row: SpanRow | Row[Any]) -> Span:
    """Row → Span (``sequence`` = ``row.seq``); ``row`` may be a plain row of the spans table."""
    return Span(
        span_id=row.span_id,
        rollout_id=row.rollout_id,
        attempt_id=row.attempt_id,
        kind=SpanKind(row.kind),
        name=row.name,
        status=cast(SpanStatus, row.status),  # validated by Span
        error=row.error,
        llm=_llm_from_json(row.llm_json),
        attributes=loads(row.attributes_json) or {},
        started_at=row.started_at,
        ended_at=row.ended_at,
        sequence=row.seq,
        tenant=row.tenant,
    )


def reward_to_row(r: Reward, seq: int) -> RewardRow:
    """Reward → row with the store-assigned sequence number ``seq``.

    Raises:
        UserError: an infinite value (a reward is a finite number, or ``None``/NaN for "no valid value",
            which is stored invalid), or bad id or scalar text.
    """
    if r.value is not None and math.isinf(r.value):
        raise UserError(
            f"reward {r.reward_id!r} is {r.value!r}; a reward must be a finite number (None or NaN marks it invalid)"
        )
    return RewardRow(
        seq=seq,
        reward_id=ident("reward_id", r.reward_id),
        rollout_id=ident("rollout_id", r.rollout_id),
        attempt_id=ident("attempt_id", r.attempt_id),
        span_id=ident("span_id", r.span_id),
        name=plain("reward name", r.name),
        value=r.value,
        valid=r.valid,
        final=r.final,
        source=plain("reward source", r.source),
        metadata_json=dumps(r.metadata),
        created_at=r.created_at,
        tenant=_tenant(r.tenant),
    )


def row_to_reward(row: RewardRow) -> Reward:
    """Row → Reward (``sequence`` = ``row.seq``)."""
    return Reward(
        reward_id=row.reward_id,
        rollout_id=row.rollout_id,
        attempt_id=row.attempt_id,
        span_id=row.span_id,
        name=row.name,
        value=row.value,
        final=row.final,
        source=row.source,
        metadata=loads(row.metadata_json) or {},
        created_at=row.created_at,
        sequence=row.seq,
        tenant=row.tenant,
    )


def resource_to_row(r: ResourceVersion) -> ResourceRow:
    """ResourceVersion → row."""
    return ResourceRow(
        name=plain("resource name", r.name),
        version=r.version,
        kind=r.kind,
        payload_json=dumps(r.payload),
        active=r.active,
        created_at=r.created_at,
    )


def row_to_resource(row: ResourceRow) -> ResourceVersion:
    """Row → ResourceVersion."""
    return ResourceVersion(
        name=row.name,
        version=row.version,
        kind=cast(ResourceKind, row.kind),  # validated by ResourceVersion
        payload=loads(row.payload_json) or {},
        active=row.active,
        created_at=row.created_at,
    )


#: Columns added after the first store files were made, as ``(table, column, SQL type, indexed)``: the tenant
#: columns (:mod:`agentforge.stores.tenants`) and the rollouts' subjects (``forget --user/--session``).
ADDED_COLUMNS = (
    ("af_rollouts", "tenant", "VARCHAR(63)", True),
    ("af_spans", "tenant", "VARCHAR(63)", False),
    ("af_rewards", "tenant", "VARCHAR(63)", False),
    ("af_rollouts", "user_id", "VARCHAR(200)", True),
    ("af_rollouts", "session_id", "VARCHAR(200)", True),
)


def add_missing_columns(conn: Connection) -> None:
    """Add the nullable :data:`ADDED_COLUMNS` (and their indexes) that an older store file's tables lack.

    ``create_all`` makes missing tables but never alters existing ones; every existing row keeps ``NULL``
    (no tenant, no subject).
    """
    inspector = inspect(conn)
    for table, column, sql_type, indexed in ADDED_COLUMNS:
        if not inspector.has_table(table) or column in {c["name"] for c in inspector.get_columns(table)}:
            continue
        conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}"))
        if indexed:
            conn.execute(text(f"CREATE INDEX IF NOT EXISTS ix_{table}_{column} ON {table} ({column})"))
