"""The span writer's cursor: the driver's own DBAPI cursor inside an open write transaction, with the few
statements the batched write path needs (lookups by many ids, sequence numbers, bulk inserts) spelled for
SQLite and PostgreSQL, and driver errors raised as SQLAlchemy's so the transaction runner retries them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlmodel import Session

from agentforge.stores.engine import wrap_driver_error

__all__ = ["BatchCursor"]

#: Bound values per SQLite statement in bulk inserts (SQLite's default limit is 32,766 since 3.32; the
#: rows of one statement are also one lock release, so a few hundred rows per statement suffice).
_SQLITE_MAX_VARIABLES = 3_000
_CHUNK = 500  # ids per IN (...) query (SQLite's default variable limit is 32766; PostgreSQL has none)
#: ``n`` numbers of the store-wide sequence on PostgreSQL; the sequence's name is looked up once per query,
#: not once per number (``pg_get_serial_sequence`` per row cost 2.6 ms per 400 numbers, this 0.4 ms).
_PG_NEXTVALS = (
    "WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence('af_sequence', 'seq')::regclass AS seq) "
    "SELECT nextval(s.seq) FROM s, generate_series(1, %s)"
)


def _chunks(values: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(values), _CHUNK):
        yield values[i : i + _CHUNK]


class BatchCursor:
    """A DBAPI cursor on a driver connection (inside its open transaction); driver errors are raised as
    SQLAlchemy's ``DBAPIError`` subclasses, so the transaction runner retries them as usual.

    Args:
        connection: the driver's connection (``sqlite3.Connection``, ``psycopg.Connection``).
        dialect: the engine's SQLAlchemy dialect.
    """

    def __init__(self, connection: Any, dialect: Any) -> None:
        self._dialect, self._connection = dialect, connection
        self.placeholder = "?" if dialect.name == "sqlite" else "%s"
        self.postgres = dialect.name == "postgresql"
        self._cursor = connection.cursor()

    @classmethod
    def of(cls, s: Session) -> BatchCursor:
        """The cursor of a session's connection (same transaction)."""
        conn = s.connection()
        return cls(conn.connection.dbapi_connection, conn.dialect)

    def _wrap(self, sql: str, params: Any, exc: Exception) -> Exception:
        return wrap_driver_error(self._dialect, sql, params, exc, self._connection)

    def next_seqs(self, n: int) -> list[int]:
        """``n`` fresh sequence numbers, ascending (see :func:`agentforge.stores.sql_batch.next_seqs`)."""
        if n <= 0:
            return []
        if self.postgres:
            return sorted(int(v) for (v,) in self.query(_PG_NEXTVALS, (n,)))
        bumped = self.query(  # one statement once the counter row exists (after the first number)
            "UPDATE sqlite_sequence SET seq = seq + ? WHERE name = 'af_sequence' RETURNING seq", (n,)
        )
        if bumped:
            top = int(bumped[0][0])
            return list(range(top - n + 1, top + 1))
        self.query("INSERT INTO af_sequence (seq, taken_at) VALUES (?, 0)", (n,))
        self.query("DELETE FROM af_sequence WHERE seq = ?", (n,))
        return list(range(1, n + 1))

    def rows_in(self, sql: str, ids: Sequence[str]) -> Iterable[tuple[Any, ...]]:
        """The rows of ``sql`` whose ``{in_ids}`` becomes a test of one column against ``ids``: PostgreSQL
        ``= ANY(%s)`` with the ids as one array (one query text, so the driver prepares it once and the
        server plans it once: a 400-id ``IN`` list cost 3-4 ms of planning per batch), SQLite ``IN (?, ...)``
        in chunks of :data:`_CHUNK` ids (its bound-variable limit)."""
        if not ids:
            return
        if self.postgres:
            yield from self.query(sql.format(in_ids="= ANY(%s::text[])"), (list(ids),))
            return
        for chunk in _chunks(ids):
            yield from self.query(sql.format(in_ids=f"IN ({', '.join(['?'] * len(chunk))})"), tuple(chunk))

    def query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        try:
            self._cursor.execute(sql, params)
            return list(self._cursor.fetchall()) if self._cursor.description is not None else []
        except Exception as exc:
            raise self._wrap(sql, params, exc) from exc

    def insert_rows(self, table: str, columns: str, width: int, rows: list[tuple[Any, ...]]) -> None:
        """Insert ``rows`` (tuples of ``width`` values, in ``columns`` order) into ``table``: PostgreSQL's
        ``COPY ... FROM STDIN`` (about 1.5× faster per row than a pipelined ``executemany``), on SQLite
        multi-row ``INSERT ... VALUES (...), (...)`` statements of up to :data:`_SQLITE_MAX_VARIABLES`
        values: ``executemany`` steps the statement once per row and releases the interpreter lock each
        time, and in a busy process (the gateway's event loop) getting it back can take a thread switch
        interval per row. A duplicate key fails the whole call either way (the transaction is retried)."""
        if self._dialect.name == "postgresql":
            sql = f"COPY {table} ({columns}) FROM STDIN"
            try:
                with self._cursor.copy(sql) as copy:
                    for row in rows:
                        copy.write_row(row)
            except Exception as exc:
                raise self._wrap(sql, rows[:3], exc) from exc
            return
        one = f"({', '.join([self.placeholder] * width)})"
        per = max(1, _SQLITE_MAX_VARIABLES // width)
        for start in range(0, len(rows), per):  # multi-row statements: one sqlite3_step per chunk of rows
            chunk = rows[start : start + per]
            sql = f"INSERT INTO {table} ({columns}) VALUES {', '.join([one] * len(chunk))}"
            try:
                self._cursor.execute(sql, [value for row in chunk for value in row])
            except Exception as exc:
                raise self._wrap(sql[:200], chunk[:3], exc) from exc
