"""Engine set-up and the transaction runner shared by the SQL store's parts.

* **SQLite** runs in WAL mode (readers never block the writer) with ``busy_timeout``; every write
  transaction starts with ``BEGIN IMMEDIATE``, so it takes the single write lock up front and the
  read-then-write steps inside it (claim, idempotent insert, sequence numbers) are serialised across
  threads *and* processes. ``sqlite://`` is an in-memory database shared by all threads of one store
  (one connection through ``StaticPool``, guarded by a lock).
* **PostgreSQL** runs at ``READ COMMITTED``; rows are locked with ``SELECT ... FOR UPDATE`` (``SKIP
  LOCKED`` for claims), the attempt row before the rollout row (one lock order everywhere).
* Transient failures ("database is locked", serialization failures, deadlocks, dropped connections)
  are retried with exponential backoff and jitter; only when the retries are exhausted does a
  :class:`~agentforge.errors.StoreError` reach the caller. A lost race on an idempotent insert shows up
  as a unique-key violation and is retried too: the retry finds and returns the stored row.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.pool import StaticPool
from sqlmodel import Session, col, create_engine, select

from agentforge.errors import AgentForgeError, MissingExtraError, NotFoundError, StoreError, UserError
from agentforge.stores.tables import AttemptRow, RolloutRow
from agentforge.types import AttemptState

__all__ = [
    "Transactor",
    "open_engine",
    "wrap_driver_error",
    "is_memory_url",
    "rollout_row",
    "attempt_row",
    "running_attempt_id",
]

T = TypeVar("T")

_TRANSIENT_SQLSTATES = {"40001", "40P01", "55P03", "57P01", "08000", "08003", "08006"}
_TRANSIENT_MESSAGES = ("database is locked", "database table is locked", "database is busy")


def is_transient(exc: DBAPIError) -> bool:
    if exc.connection_invalidated:
        return True
    if getattr(exc.orig, "sqlstate", None) in _TRANSIENT_SQLSTATES:
        return True
    return any(m in str(exc.orig).lower() for m in _TRANSIENT_MESSAGES)


def is_memory_url(url: URL) -> bool:
    """Whether ``url`` is an in-memory SQLite database (``sqlite://``)."""
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def open_engine(
    url: str,
    busy_timeout_s: float,
    sqlite_synchronous: str = "FULL",
    pool: dict[str, Any] | None = None,
    wal_autocheckpoint: bool = True,
) -> Engine:
    """Create the engine for a SQLite or PostgreSQL URL (see the module docstring).

    Args:
        url: SQLAlchemy URL.
        busy_timeout_s: SQLite ``busy_timeout``, seconds.
        sqlite_synchronous: SQLite ``PRAGMA synchronous``: ``"FULL"`` (a commit survives power loss) or
            ``"NORMAL"`` (about twice as fast in WAL mode; survives process crashes only).
        pool: PostgreSQL connection-pool options for SQLAlchemy's ``create_engine`` (``pool_size``,
            ``max_overflow``, ``pool_timeout`` in seconds, ``pool_recycle``); ignored for SQLite.
        wal_autocheckpoint: SQLite: commits run WAL checkpoints themselves (SQLite's default); ``False`` when
            a :class:`~agentforge.stores.checkpoint.WalCheckpointer` runs them instead.

    Raises:
        UserError: unsupported URL scheme.
        MissingExtraError: a PostgreSQL URL without ``psycopg`` installed.
    """
    sa_url = make_url(url)
    backend = sa_url.get_backend_name()
    if backend == "postgresql":
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:
            raise MissingExtraError("psycopg", "postgres", "The PostgreSQL trace store") from exc
        # No pool_pre_ping: a dropped connection fails the transaction as invalidated and run() retries it.
        return create_engine(url, **(pool or {}))
    if backend != "sqlite":
        raise UserError(
            f"unsupported store URL {sa_url.render_as_string(hide_password=True)!r}: use "
            "sqlite:///path.db, sqlite:// (in memory) or postgresql+psycopg://..."
        )
    if sqlite_synchronous not in ("FULL", "NORMAL"):
        raise UserError(f"sqlite_synchronous must be 'FULL' or 'NORMAL', got {sqlite_synchronous!r}")
    memory = is_memory_url(sa_url)
    connect_args = {"check_same_thread": False, "timeout": busy_timeout_s}
    if memory:
        engine = create_engine("sqlite://", connect_args=connect_args, poolclass=StaticPool)
    else:
        Path(sa_url.database or "").expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args=connect_args)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see _on_begin)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        if not memory:
            cur.execute("PRAGMA journal_mode = WAL")
            cur.execute(f"PRAGMA synchronous = {sqlite_synchronous}")
            if not wal_autocheckpoint:
                cur.execute("PRAGMA wal_autocheckpoint = 0")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        write = conn.get_execution_options().get("af_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


class Transactor:
    """Runs functions of a session in one transaction each, with the retry policy above.

    Args:
        engine: from :func:`open_engine`.
        label: how errors name the store (URL without password).
        max_retries: retries of a transaction that hit a transient error before ``StoreError``.

    Attributes:
        after_write: called after every committed write transaction with the ``rows`` given to :meth:`run`
            or :meth:`run_raw` (the span writer's batches give their size; other writes count as 1), e.g. to
            wake a WAL checkpointer; ``None``: nothing is called.
    """

    after_write: Callable[[int], None] | None = None

    def __init__(self, engine: Engine, label: str, max_retries: int) -> None:
        self.engine, self.label, self.max_retries = engine, label, max_retries
        self._write_engine = engine.execution_options(af_write=True)
        self._lock = threading.RLock() if is_memory_url(engine.url) else None
        self.closed = False

    def run(self, fn: Callable[[Session], T], *, write: bool, integrity_retries: int = 3, rows: int = 1) -> T:
        """Run ``fn(session)`` in one transaction (``write``: takes the write lock up front on SQLite;
        ``rows``: how many rows it writes, as :attr:`after_write` is told).

        Raises:
            AgentForgeError: whatever ``fn`` raised (no retry).
            StoreError: the retries are exhausted or the error is not transient.
        """
        engine = self._write_engine if write else self.engine

        def once() -> T:
            with Session(engine) as session, session.begin():
                return fn(session)

        result = self._retrying(once, integrity_retries)
        if write and self.after_write is not None:
            self.after_write(rows)
        return result

    def _retrying(self, once: Callable[[], T], integrity_retries: int = 3) -> T:
        """``once()`` under the store's lock (in-memory SQLite), retried as the module docstring says."""
        if self.closed:
            raise UserError(f"{self.label} is closed; create a new store")
        delay, integrity_left = 0.005, integrity_retries
        for attempt in range(self.max_retries + 1):
            try:
                with self._lock if self._lock is not None else nullcontext():
                    return once()
            except AgentForgeError:
                raise
            except IntegrityError as exc:
                # A concurrent insert of the same id / version won: the retry reads the stored row.
                if integrity_left <= 0 or attempt == self.max_retries:
                    raise StoreError(f"{self.label}: integrity error: {exc.orig}") from exc
                integrity_left -= 1
            except DBAPIError as exc:
                if not is_transient(exc) or attempt == self.max_retries:
                    raise StoreError(
                        f"{self.label}: {type(exc.orig).__name__}: {exc.orig} (after {attempt} retries)"
                    ) from exc
            time.sleep(delay * (1.0 + random.random()))
            delay = min(delay * 2, 0.5)
        raise AssertionError("unreachable")  # pragma: no cover

    def run_raw(self, fn: Callable[[Any, Any], T], *, integrity_retries: int = 3, rows: int = 1) -> T:
        """Run ``fn(dbapi_connection, dialect)`` in one *write* transaction on a pooled driver connection,
        with :meth:`run`'s retry policy but without an ORM session: the span writer's hot path, where a
        session's begin/commit machinery cost more CPU than the rows themselves.

        ``fn`` issues its statements on the driver connection; driver errors it raises must already be
        SQLAlchemy ``DBAPIError`` subclasses (:func:`wrap_driver_error`). SQLite transactions start with
        ``BEGIN IMMEDIATE``; PostgreSQL's driver opens one on the first statement. A connection that broke
        is invalidated (the pool drops it) before the retry. ``integrity_retries``: as in :meth:`run` (a
        concurrent insert of the same key lost the race; the retry runs ``fn`` again). ``rows``: how many
        rows the transaction writes, as :attr:`after_write` is told.

        Raises:
            AgentForgeError: whatever ``fn`` raised (no retry).
            StoreError: the retries are exhausted or the error is not transient.
        """
        dialect = self.engine.dialect

        def once() -> T:
            raw = self.engine.raw_connection()
            try:
                try:
                    if dialect.name == "sqlite":
                        raw.driver_connection.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
                    result = fn(raw.driver_connection, dialect)
                    raw.commit()
                except BaseException as exc:
                    broken = isinstance(exc, DBAPIError) and exc.connection_invalidated
                    try:
                        raw.rollback()
                    except Exception:
                        broken = True
                    if broken:
                        raw.invalidate()
                    if isinstance(exc, dialect.loaded_dbapi.Error):
                        raise wrap_driver_error(dialect, "BEGIN/COMMIT", None, exc, raw) from exc
                    raise
                return result
            finally:
                raw.close()

        result = self._retrying(once, integrity_retries)
        if self.after_write is not None:
            self.after_write(rows)
        return result

    def close(self) -> None:
        """Dispose of the pool; later ``run`` calls raise ``UserError``. Safe to call twice."""
        if not self.closed:
            self.closed = True
            self.engine.dispose()


def wrap_driver_error(
    dialect: Any, statement: str, params: Any, exc: Exception, connection: Any
) -> Exception:
    """A driver exception as SQLAlchemy's ``DBAPIError`` subclass (``IntegrityError``,
    ``OperationalError``, ...), flagged ``connection_invalidated`` when the dialect sees a disconnect,
    so :class:`Transactor` classifies and retries it like an ORM error; other exceptions unchanged."""
    if not isinstance(exc, dialect.loaded_dbapi.Error):
        return exc
    try:
        gone = bool(dialect.is_disconnect(exc, connection, None))
    except Exception:
        gone = False
    return DBAPIError.instance(
        statement, params, exc, dialect.loaded_dbapi.Error, dialect=dialect, connection_invalidated=gone
    )


# --- row helpers shared by the store's parts --------------------------------------------------------


def rollout_row(s: Session, rollout_id: str, lock: bool = False) -> RolloutRow:
    """The rollout's row (``lock``: ``FOR UPDATE``). Raises: ``NotFoundError``."""
    q = select(RolloutRow).where(RolloutRow.rollout_id == rollout_id)
    row = s.exec(q.with_for_update() if lock else q).first()
    if row is None:
        raise NotFoundError(f"rollout {rollout_id!r} does not exist")
    return row


def attempt_row(s: Session, attempt_id: str, lock: bool = False) -> AttemptRow:
    """The attempt's row (``lock``: ``FOR UPDATE``). Raises: ``NotFoundError``."""
    q = select(AttemptRow).where(AttemptRow.attempt_id == attempt_id)
    row = s.exec(q.with_for_update() if lock else q).first()
    if row is None:
        raise NotFoundError(f"attempt {attempt_id!r} does not exist")
    return row


def running_attempt_id(s: Session, rollout_id: str) -> str | None:
    """Id of the rollout's running attempt, or ``None``."""
    q = (
        select(AttemptRow.attempt_id)
        .where(AttemptRow.rollout_id == rollout_id, AttemptRow.state == AttemptState.running.value)
        .order_by(col(AttemptRow.number).desc())
        .limit(1)
    )
    return s.exec(q).first()
