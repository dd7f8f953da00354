"""``SQLStore``: the :class:`~agentforge.ports.TraceStore` on SQLite (default) or PostgreSQL.

SQLite (WAL, ``BEGIN IMMEDIATE`` writes) or PostgreSQL (row locks, ``SKIP LOCKED`` claims), with
transient errors retried internally: see :mod:`agentforge.stores.engine`. The rollout queue (claims,
attempts, retries) lives in :mod:`agentforge.stores.sql_rollouts`; spans, rewards and resources here.

Spans and rewards share one store-wide sequence (``af_sequence``): numbers are unique and increase in
the order they are taken. See :mod:`agentforge.stores.tables` for the schema and the text policy
(structured fields round-trip byte-exact; lone surrogates/``NUL`` in scalar fields raise ``UserError``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, cast

from sqlalchemy.engine import make_url
from sqlmodel import Session, SQLModel, col, select

from agentforge.config import default_store_url
from agentforge.errors import AgentForgeError, UserError
from agentforge.stores.checkpoint import WalCheckpointer
from agentforge.stores.engine import Transactor, attempt_row, is_memory_url, open_engine, rollout_row
from agentforge.stores.sql_batch import Prepared, is_late, next_seqs, prepare_span, write_items, write_spans
from agentforge.stores.sql_pages import RolloutPages
from agentforge.stores.sql_resources import ResourceVersions
from agentforge.stores.sql_rollouts import RolloutQueue
from agentforge.stores.tables import (
    AttemptRow,
    RewardRow,
    RolloutRow,
    SpanRow,
    add_missing_columns,
    attempt_to_row,
    reward_to_row,
    rollout_to_row,
    row_to_reward,
    row_to_span,
    span_to_row,
)
from agentforge.stores.tenants import TenantKeys
from agentforge.stores.writer import GroupCommitWriter
from agentforge.types import (
    Attempt,
    AttemptState,
    Reward,
    Rollout,
    RolloutState,
    Span,
    SpanKind,
)

__all__ = ["SQLStore", "DEFAULT_COMMIT_DELAY_S"]

#: The span writer's default group-commit delay on SQLite, seconds (see :class:`SQLStore`'s ``commit_delay_s``).
DEFAULT_COMMIT_DELAY_S = 0.002


class SQLStore(RolloutQueue, RolloutPages, ResourceVersions):
    """Trace store on SQLite or PostgreSQL through SQLModel / SQLAlchemy 2.

    Args:
        url: SQLAlchemy URL; ``None`` uses :func:`agentforge.config.default_store_url` (SQLite file
            under ``$AGENTFORGE_HOME``). ``sqlite:///path.db`` (file, WAL), ``sqlite://`` (in-memory,
            shared by the threads of this store only) or ``postgresql+psycopg://user:pw@host/db``.
        busy_timeout_s: how long one SQLite statement waits for the write lock, seconds.
        sqlite_synchronous: ``"FULL"`` (default: a commit survives power loss) or ``"NORMAL"`` (about twice
            as fast; a commit survives process crashes but not power loss). Ignored for PostgreSQL.
        max_retries: retries of a transaction that hit a transient error before ``StoreError``.
        create_tables: create missing tables on start (idempotent; safe from many processes).
        pool: PostgreSQL pool options (``pool_size``, ``max_overflow``, ``pool_timeout``, ...), passed to
            SQLAlchemy's ``create_engine``. Every store call holds a connection only for its own
            transaction, never across a streamed answer.
        background_checkpoints: SQLite file: WAL checkpoints run on a thread and connection of their own
            (:class:`~agentforge.stores.checkpoint.WalCheckpointer`) instead of inside commits, so the span
            writer never copies pages into the database file; ``False``: SQLite's automatic checkpoints.
        commit_delay_s: the span writer's group-commit delay, seconds (:mod:`agentforge.stores.writer`): after
            a batch that served 4 or more callers, the next batch waits this long to fill unless 4 or more
            items are queued already. Under concurrent load (a gateway at 32 clients) the batches grow and the
            store's CPU per span falls; a lone caller never waits for it, nor does a backlog (a burst of
            flushes). ``None``: :data:`DEFAULT_COMMIT_DELAY_S` on SQLite, ``0`` on PostgreSQL (whose commits
            cost the server, not this process, and where closed-loop writers measured no gain from it).
            ``0``: the next batch is taken at once.

    Raises:
        UserError: unsupported URL scheme.
        MissingExtraError: a PostgreSQL URL without ``psycopg`` installed.
        StoreError: the database cannot be opened.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        busy_timeout_s: float = 5.0,
        sqlite_synchronous: str = "FULL",
        max_retries: int = 10,
        create_tables: bool = True,
        pool: dict[str, Any] | None = None,
        background_checkpoints: bool = True,
        commit_delay_s: float | None = None,
    ) -> None:
        self.url = url or default_store_url()
        sa_url = make_url(self.url)
        self.dialect = sa_url.get_backend_name()
        self._checkpointer: WalCheckpointer | None = None
        if background_checkpoints and self.dialect == "sqlite" and not is_memory_url(sa_url):
            self._checkpointer = WalCheckpointer(str(sa_url.database), busy_timeout_s, sqlite_synchronous)
        engine = open_engine(
            self.url, busy_timeout_s, sqlite_synchronous, pool, wal_autocheckpoint=self._checkpointer is None
        )
        self._tx = Transactor(engine, repr(self), max_retries)
        if self._checkpointer is not None:
            self._tx.after_write = self._checkpointer.committed
        if commit_delay_s is None:
            commit_delay_s = DEFAULT_COMMIT_DELAY_S if self.dialect == "sqlite" else 0.0
        self._writer: GroupCommitWriter[Span | Reward | Prepared, Span | Reward] = GroupCommitWriter(
            self._write_queued,
            f"agentforge-writer-{make_url(self.url).get_backend_name()}",
            max_batch=1024,
            commit_delay_s=commit_delay_s,
        )  # a batch's fixed cost (lookups, commit, its sync) shared by up to 1,024 items: ~1.3 MB of span rows
        if create_tables:
            self._tx.run(_create_tables, write=True, integrity_retries=5)
        self.tenant_keys = TenantKeys(self._tx)  # the key → tenant table (agentforge.stores.tenants)

    def __repr__(self) -> str:
        return f"SQLStore({make_url(self.url).render_as_string(hide_password=True)!r})"

    def __enter__(self) -> SQLStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- spans and rewards: through the group-commit writer ----------------------------------------
    def write_batch(self, items: Sequence[Span | Reward]) -> list[Span | Reward | AgentForgeError]:
        """Write spans and rewards in order in one transaction (see :mod:`agentforge.stores.sql_batch`).

        Args:
            items: spans and rewards; each keeps the rules of :meth:`add_span` / :meth:`add_reward`.

        Returns:
            One entry per item: the stored item, or the ``NotFoundError``/``UserError`` it alone
            failed with (nothing of it written).

        Raises:
            StoreError: the transaction failed after the retries (nothing written).
        """
        if all(isinstance(item, Span) for item in items):  # the writer's usual batch: no ORM session
            return self._tx.run_raw(
                lambda conn, dialect: write_spans(conn, dialect, items),  # type: ignore[arg-type]
                rows=len(items),
            )
        return self._tx.run(lambda s: write_items(s, items), write=True, rows=len(items))

    def _write_queued(
        self, items: Sequence[Span | Reward | Prepared]
    ) -> list[Span | Reward | AgentForgeError]:
        """The writer thread's batch: :meth:`write_batch`, with spans :meth:`submit_many` serialised already."""
        if self._checkpointer is not None and self._checkpointer.behind:  # bound the WAL under sustained load
            self._checkpointer.catch_up()
        if all(isinstance(item, Span | Prepared) for item in items):
            return self._tx.run_raw(
                lambda conn, dialect: write_spans(conn, dialect, items),  # type: ignore[arg-type]
                rows=len(items),
            )
        return self.write_batch([item.span if isinstance(item, Prepared) else item for item in items])

    def submit(self, item: Span | Reward) -> Future[Span | Reward]:
        """Queue a span or reward for this store's writer thread (group commit, see
        :mod:`agentforge.stores.writer`); the future resolves once it is committed."""
        return self._writer.submit(item)

    def submit_many(
        self, items: Sequence[Span | Reward], *, stored: bool = True
    ) -> Future[list[Span | Reward | BaseException | None]]:
        """Queue many spans and rewards at once behind one future (a tracer's flush; see
        :meth:`GroupCommitWriter.submit_many <agentforge.stores.writer.GroupCommitWriter.submit_many>`): it
        resolves once every item is committed, to one outcome per item (the stored item or its error).
        Spans are serialised here, in the caller's thread, while the writer thread commits earlier batches.

        Args:
            items: spans and rewards, written in order.
            stored: ``False`` for a caller that only checks for errors: a stored span's outcome (written now
                or before) is then ``None`` instead of its stored copy, which the writer thread no longer
                builds (about a tenth of its time per span); errors and rewards come back as usual.
        """
        keep = stored or self.listener is not None  # a commit listener reads the stored spans
        utf8 = self.dialect == "sqlite"  # JSON as UTF-8 bytes, stored as text by SQLite as they are
        future = self._writer.submit_many(
            [prepare_span(i, keep, utf8) if isinstance(i, Span) else i for i in items]
        )
        return cast("Future[list[Span | Reward | BaseException | None]]", future)  # None: a span not kept

    def submit_async(self, item: Span | Reward) -> asyncio.Future[Span | Reward]:
        """:meth:`submit` for coroutines: a future of the running loop (see :meth:`TraceStore.submit_async`)."""
        return self._writer.submit_async(item)

    def add_span(self, span: Span) -> Span:
        """Store a span; idempotent by ``span_id``; assigns ``sequence``. Blocks until committed.

        A span without ``rollout_id`` is an orphan (allowed). With a ``rollout_id`` but no ``attempt_id``
        it is stamped with the rollout's running attempt, if any, so ``valid_only`` can judge it.
        Concurrent callers of one store share transactions (group commit).

        A **late** LLM span — its rollout already finished (succeeded, failed, timed out, cancelled), the
        attempt it names no longer runs, or it names none while the rollout has had attempts but runs none
        — is stored quarantined: ``attributes["late"] = True`` and ``attributes["late_reason"]`` say so in
        the returned and listed span, and ``list_spans(valid_only=True)`` never returns it, so a late call
        cannot rewrite a finished rollout's training data (DESIGN fact 8).

        Returns:
            The stored span (the existing one if the id was already present).

        Raises:
            NotFoundError: unknown rollout or attempt.
            UserError: the attempt belongs to another rollout; bad text in a scalar field.
        """
        return self._writer.write(span)  # type: ignore[return-value]

    def list_spans(
        self,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        kind: SpanKind | None = None,
        orphans: bool = False,
        valid_only: bool = False,
        *,
        tenant: str | None = None,
        after_sequence: int | None = None,
        limit: int | None = None,
    ) -> list[Span]:
        """Spans by ``sequence``.

        Args:
            rollout_id: only this rollout's spans.
            attempt_id: only this attempt's spans.
            kind: only spans of this kind.
            orphans: only spans without a rollout (not combinable with ``rollout_id``/``attempt_id``).
            tenant: only spans recorded for this tenant.
            valid_only: per rollout, keep only spans of the succeeded attempt if there is one, else of
                the latest attempt; spans without an attempt id are kept too. Spans stored as late (see
                :meth:`add_span`) are always left out.
            after_sequence: only spans with a larger ``sequence`` (keyset paging).
            limit: at most this many rows, counted before ``valid_only`` leaves any out (a page of the
                sequence order: the next one starts after the last row's sequence).

        Raises:
            NotFoundError: unknown rollout or attempt.
            UserError: ``orphans`` combined with an id.
        """
        if orphans and (rollout_id is not None or attempt_id is not None):
            raise UserError(
                "list_spans(orphans=True) lists spans without a rollout; do not pass rollout_id/attempt_id"
            )

        def fn(s: Session) -> list[Span]:
            # plain rows, no ORM object per span (sqlmodel's types omit the table models' __table__)
            q = select(SpanRow.__table__)  # type: ignore[attr-defined]
            if orphans:
                q = q.where(col(SpanRow.rollout_id).is_(None))
            if rollout_id is not None:
                rollout_row(s, rollout_id)
                q = q.where(SpanRow.rollout_id == rollout_id)
            if attempt_id is not None:  # found through its rollout's index (af_spans.attempt_id has none)
                attempt = attempt_row(s, attempt_id)
                q = q.where(SpanRow.rollout_id == attempt.rollout_id, SpanRow.attempt_id == attempt_id)
            if kind is not None:
                q = q.where(SpanRow.kind == SpanKind(kind).value)
            if tenant is not None:
                q = q.where(SpanRow.tenant == tenant)
            if after_sequence is not None:
                q = q.where(col(SpanRow.seq) > after_sequence)
            q = q.order_by(col(SpanRow.seq))
            spans = [row_to_span(r) for r in s.execute(q if limit is None else q.limit(max(0, limit)))]
            return self._valid_spans(s, spans) if valid_only else spans

        return self._tx.run(fn, write=False)

    @staticmethod
    def _valid_spans(s: Session, spans: list[Span]) -> list[Span]:
        rollout_ids = sorted({sp.rollout_id for sp in spans if sp.rollout_id is not None})
        chosen: dict[str, AttemptRow] = {}
        for i in range(0, len(rollout_ids), 500):
            q = select(AttemptRow).where(col(AttemptRow.rollout_id).in_(rollout_ids[i : i + 500]))
            for att in s.exec(q):
                best = chosen.get(att.rollout_id)
                rank = (att.state == AttemptState.succeeded.value, att.number)
                if best is None or rank > (best.state == AttemptState.succeeded.value, best.number):
                    chosen[att.rollout_id] = att
        return [
            sp
            for sp in spans
            if not is_late(sp)
            and (
                sp.rollout_id not in chosen
                or sp.attempt_id is None
                or sp.attempt_id == chosen[sp.rollout_id].attempt_id
            )
        ]

    # --- rewards ----------------------------------------------------------------------------------
    def add_reward(self, reward: Reward) -> Reward:
        """Store a reward (idempotent by ``reward_id``) attached by the rule in ``Reward``'s docstring.

        Without ``span_id`` it follows the rollout's latest span recorded (committed) before it. Without
        ``attempt_id`` it takes the running attempt's id, else that of the span it follows. ``None`` is
        stored as an invalid reward, never as a number. Blocks until committed (group commit).

        Returns:
            The stored reward with ``span_id``, ``attempt_id`` and ``sequence`` filled in.

        Raises:
            NotFoundError: unknown rollout, attempt or span.
            UserError: the span/attempt belongs to another rollout; bad text in a scalar field.
        """
        return self._writer.write(reward)  # type: ignore[return-value]

    def list_rewards(
        self, rollout_id: str, *, after_sequence: int | None = None, limit: int | None = None
    ) -> list[Reward]:
        """Rewards of a rollout by ``sequence`` (after ``after_sequence``, at most ``limit``). Raises:
        ``NotFoundError``."""

        def fn(s: Session) -> list[Reward]:
            rollout_row(s, rollout_id)
            q = select(RewardRow).where(RewardRow.rollout_id == rollout_id)
            if after_sequence is not None:
                q = q.where(col(RewardRow.seq) > after_sequence)
            q = q.order_by(col(RewardRow.seq))
            return [row_to_reward(r) for r in s.exec(q if limit is None else q.limit(limit))]

        return self._tx.run(fn, write=False)

    def final_reward(self, rollout_id: str) -> Reward | None:
        """The last ``final`` reward by sequence, else the last reward, else ``None``; it may be
        invalid (``value is None``): callers mask it. Raises: ``NotFoundError``."""

        def fn(s: Session) -> Reward | None:
            rollout_row(s, rollout_id)
            q = (
                select(RewardRow)
                .where(RewardRow.rollout_id == rollout_id)
                .order_by(col(RewardRow.final).desc(), col(RewardRow.seq).desc())
                .limit(1)
            )
            row = s.exec(q).first()
            return None if row is None else row_to_reward(row)

        return self._tx.run(fn, write=False)

    # --- import (trace replay) ----------------------------------------------------------------------
    def import_trace(
        self, rollout: Rollout, attempts: Sequence[Attempt], items: Sequence[Span | Reward]
    ) -> bool:
        """Insert one exported rollout as it was: ids, states, timestamps and attempts kept, in one
        transaction (all or nothing). Used by :func:`agentforge.trainers.replay.import_jsonl`.

        Args:
            rollout, attempts: the finished rollout and its attempts (none of them running).
            items: its spans and rewards in their original order; each gets a new store ``sequence``
                in this order. References (attempt and span ids) are kept as given.

        Returns: ``True`` if inserted, ``False`` if ``rollout_id`` was already present (nothing written).

        Raises:
            UserError: the rollout is not finished or an attempt is still running (imported rollouts are
                data, never work a runner would claim or requeue); an attempt, span or reward id already
                exists elsewhere; bad scalar text.
        """
        running = [a.attempt_id for a in attempts if a.state == AttemptState.running]
        if not RolloutState(rollout.state).finished or running:
            what = f"attempt {running[0]!r} is running" if running else f"it is {rollout.state}"
            raise UserError(
                f"rollout {rollout.rollout_id!r} cannot be imported: {what}; import finished rollouts"
            )
        rollout_to_row(rollout)  # check scalar text before writing
        for attempt in attempts:
            attempt_to_row(attempt)

        def fn(s: Session) -> bool:
            if s.exec(select(RolloutRow).where(RolloutRow.rollout_id == rollout.rollout_id)).first():
                return False
            for item in [*attempts, *items]:
                table, key = {Span: (SpanRow, "span_id"), Reward: (RewardRow, "reward_id")}.get(
                    type(item), (AttemptRow, "attempt_id")
                )
                if s.exec(select(table).where(getattr(table, key) == getattr(item, key))).first():
                    raise UserError(f"{key} {getattr(item, key)!r} already exists in another rollout")
            s.add(rollout_to_row(rollout))
            s.add_all([attempt_to_row(a) for a in attempts])
            for item, seq in zip(items, next_seqs(s, len(items)), strict=True):
                s.add(span_to_row(item, seq) if isinstance(item, Span) else reward_to_row(item, seq))
            s.flush()
            return True

        return self._tx.run(fn, write=True)

    def close(self) -> None:
        """Write what is queued, then dispose of the connection pool (an in-memory database is lost).
        Safe to call twice."""
        self._writer.close()
        if self.listener is not None:  # e.g. the OTLP export: flushes what the writer committed last
            self.listener.close()
        if self._checkpointer is not None:
            self._checkpointer.close()
        self._tx.close()


def _create_tables(s: Session) -> None:
    """Create missing tables and add the columns older store files lack."""
    SQLModel.metadata.create_all(s.connection())
    add_missing_columns(s.connection())
