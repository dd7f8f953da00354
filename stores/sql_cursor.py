"""The span writer's cursor: the driver's own DBAPI cursor inside an open write transaction, with the few
statements the batched write path needs (lookups by many ids, sequence numbers, bulk inserts) spelled for
SQLite and PostgreSQL, and driver errors raised as SQLAlchemy's so the transaction runner retries them.

On SQLite every call into the driver (preparing a statement, and stepping it: once per result row) releases
the interpreter lock, and in a busy process getting it back can take up to a switch interval (5 ms) while
other threads run Python. So the SQLite spellings keep those calls few per batch: statement texts that do
not depend on the batch's size (cached by the driver, prepared once per connection), lookups whose rows come
back in one step (:meth:`BatchCursor.rows_in` with ``packed``), and inserts in one statement per power of two.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from contextlib import closing
from functools import cache
from typing import Any

import orjson
from sqlmodel import Session

from agentforge.stores.engine import wrap_driver_error

__all__ = ["BatchCursor"]

#: Most rows per SQLite insert statement: a power of two whose values stay under SQLite's default limit of
#: 32,766 bound variables (since 3.32) for the span row's 13 columns.
_SQLITE_MAX_ROWS = 1024
_CHUNK = 500  # ids per IN (...) query where SQLite lacks json_each (its old variable limit was 999)
#: ``n`` numbers of the store-wide sequence on PostgreSQL; the sequence's name is looked up once per query,
#: not once per number (``pg_get_serial_sequence`` per row cost 2.6 ms per 400 numbers, this 0.4 ms).
_PG_NEXTVALS = (
    "WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence('af_sequence', 'seq')::regclass AS seq) "
    "SELECT nextval(s.seq) FROM s, generate_series(1, %s)"
)


def _chunks(values: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(values), _CHUNK):
        yield values[i : i + _CHUNK]


@cache
def _sqlite_json() -> bool:
    """Whether the SQLite library has the JSON functions (built in by default since 3.38; earlier builds may
    lack them): checked once, on a throwaway in-memory connection."""
    try:
        with closing(sqlite3.connect(":memory:")) as probe:
            probe.execute("SELECT json_group_array(value) FROM json_each('[1]')").fetchall()
    except sqlite3.Error:
        return False
    return True


def _json_ids(ids: Sequence[str]) -> str:
    """``ids`` as one JSON array (text) for ``json_each``."""
    try:
        return orjson.dumps(list(ids)).decode()
    except TypeError:  # text orjson refuses (a lone surrogate): json writes it as an escape
        return json.dumps(list(ids))


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
        self._json = not self.postgres and _sqlite_json()
        self._max_rows = 0  # SQLite: most rows per insert statement, from the connection's variable limit

    @classmethod
    def of(cls, s: Session) -> BatchCursor:
        """The cursor of a session's connection (same transaction)."""
        conn = s.connection()
        return cls(conn.connection.dbapi_connection, conn.dialect)

    def _wrap(self, sql: str, params: Any, exc: Exception) -> Exception:
        return wrap_driver_error(self._dialect, sql, params, exc, self._connection)

    def next_seqs(self, n: int, top: int | None = None) -> list[int]:
        """``n`` fresh sequence numbers, ascending (see :func:`agentforge.stores.sql_batch.next_seqs`).

        ``top``: SQLite: the counter as :meth:`lookups` read it in this transaction; the counter is then set
        to ``top + n`` by a statement that returns nothing (one step fewer than ``RETURNING``).
        """
        if n <= 0:
            return []
        if self.postgres:
            return sorted(int(v) for (v,) in self.query(_PG_NEXTVALS, (n,)))
        if top is not None:
            self.query("UPDATE sqlite_sequence SET seq = ? WHERE name = 'af_sequence'", (top + n,))
            return list(range(top + 1, top + n + 1))
        bumped = self.query(  # one statement once the counter row exists (after the first number)
            "UPDATE sqlite_sequence SET seq = seq + ? WHERE name = 'af_sequence' RETURNING seq", (n,)
        )
        if bumped:
            top = int(bumped[0][0])
            return list(range(top - n + 1, top + 1))
        self.query("INSERT INTO af_sequence (seq, taken_at) VALUES (?, 0)", (n,))
        self.query("DELETE FROM af_sequence WHERE seq = ?", (n,))
        return list(range(1, n + 1))

    def rows_in(
        self, columns: str, source: str, ids: Sequence[str], packed: bool = False
    ) -> Iterable[tuple[Any, ...]]:
        """The rows of ``SELECT {columns} {source}`` whose ``{in_ids}`` (in ``source``) becomes a test of one
        column against ``ids``.

        PostgreSQL: ``= ANY(%s)`` with the ids as one array (one query text, so the driver prepares it once
        and the server plans it once: a 400-id ``IN`` list cost 3-4 ms of planning per batch). SQLite: ``IN
        (SELECT value FROM json_each(?))`` with the ids as one JSON array, one statement text whatever their
        number (the driver's cache keeps it prepared); ``IN (?, ...)`` in chunks of :data:`_CHUNK` ids where
        the library lacks the JSON functions.

        Args:
            columns: the select list (comma-separated expressions).
            source: the rest of the query: ``FROM ... WHERE <column> {in_ids} ...``.
            ids: the ids; none: no query, no rows.
            packed: SQLite: all rows come back as one JSON array in one row (one step of the statement, so
                one release of the interpreter lock, instead of one per row); only for columns whose values
                JSON carries exactly (text, integers, ``NULL``).

        Returns:
            The rows as tuples, in no particular order.
        """
        if not ids:
            return
        if self.postgres:
            yield from self.query(
                f"SELECT {columns} {source.format(in_ids='= ANY(%s::text[])')}", (list(ids),)
            )
            return
        if self._json:
            where = source.format(in_ids="IN (SELECT value FROM json_each(?))")
            if not packed:
                yield from self.query(f"SELECT {columns} {where}", (_json_ids(ids),))
                return
            (rows,) = self.query(f"SELECT json_group_array(json_array({columns})) {where}", (_json_ids(ids),))
            yield from map(tuple, orjson.loads(rows[0]))
            return
        for chunk in _chunks(ids):
            where = source.format(in_ids=f"IN ({', '.join(['?'] * len(chunk))})")
            yield from self.query(f"SELECT {columns} {where}", tuple(chunk))

    def lookups(
        self, specs: Sequence[tuple[str, str, Sequence[str]]], sequence: bool = False
    ) -> tuple[list[list[tuple[Any, ...]]], int | None]:
        """Several :meth:`rows_in` lookups (``packed``) at once, and the store-wide sequence's last number.

        SQLite with the JSON functions: one statement for all of them, one result row holding each lookup's
        rows as one JSON array (``json_group_array``) and the sequence's counter, so a batch's lookups cost
        the driver one statement (two steps) instead of one per lookup (see the module docstring). Elsewhere:
        one :meth:`rows_in` per lookup.

        Args:
            specs: ``(columns, source, ids)`` per lookup, as :meth:`rows_in` takes them (only columns whose
                values JSON carries exactly: text, integers, ``NULL``).
            sequence: SQLite: also read the counter of ``af_sequence`` in ``sqlite_sequence`` (inside the write
                transaction, so no one else moves it before :meth:`next_seqs` takes ``top=`` it).

        Returns:
            ``(rows per lookup, counter)``; the counter is ``None`` when not asked for, on PostgreSQL, or when
            no number was ever taken.
        """
        if self.postgres or not self._json:
            return [list(self.rows_in(c, src, ids, packed=True)) for c, src, ids in specs], None
        parts, params = [], []
        for columns, source, ids in specs:
            where = source.format(in_ids="IN (SELECT value FROM json_each(?))")
            parts.append(f"(SELECT json_group_array(json_array({columns})) {where})")
            params.append(_json_ids(ids))
        if sequence:
            parts.append("(SELECT seq FROM sqlite_sequence WHERE name = 'af_sequence')")
        (row,) = self.query(f"SELECT {', '.join(parts)}", tuple(params))
        found = [[tuple(r) for r in orjson.loads(packed)] for packed in row[: len(specs)]]
        return found, (int(row[-1]) if sequence and row[-1] is not None else None)

    def query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        try:
            self._cursor.execute(sql, params)
            return list(self._cursor.fetchall()) if self._cursor.description is not None else []
        except Exception as exc:
            raise self._wrap(sql, params, exc) from exc

    def insert_rows(
        self, table: str, columns: str, width: int, values: list[Any], utf8: tuple[int, ...] = ()
    ) -> None:
        """Insert rows of ``width`` values each, given one after the other in ``values`` (flat, in ``columns``
        order), into ``table``. ``utf8``: the positions in a row of text columns whose values may come as
        UTF-8 ``bytes`` (SQLite only: stored as text with ``CAST(? AS TEXT)``, which keeps the bytes).

        PostgreSQL: ``COPY ... FROM STDIN`` (about 1.5× faster per row than a pipelined ``executemany``).
        SQLite: multi-row ``INSERT ... VALUES (...), (...)`` statements, one per power of two in the row count
        (at most :data:`_SQLITE_MAX_ROWS` rows each): so only a dozen statement texts ever occur, each prepared
        once and then taken from the driver's cache (preparing a 400-row statement costs about 2 µs a row,
        several times what stepping it costs), and each is one step, not one per row as ``executemany``
        takes (every step releases the interpreter lock; see the module docstring). A duplicate key fails
        the whole call either way (the transaction is retried).
        """
        if self.postgres:
            sql = f"COPY {table} ({columns}) FROM STDIN"
            try:
                with self._cursor.copy(sql) as copy:
                    for start in range(0, len(values), width):
                        copy.write_row(values[start : start + width])
            except Exception as exc:
                raise self._wrap(sql, values[: 3 * width], exc) from exc
            return
        if not self._max_rows:
            limit = self._connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
            self._max_rows = min(_SQLITE_MAX_ROWS, 1 << ((limit // width).bit_length() - 1))
        left, start = len(values) // width, 0
        while left:
            n = min(self._max_rows, 1 << (left.bit_length() - 1))  # the largest power of two that fits
            sql = _insert_sql(table, columns, width, n, utf8)
            end = start + n * width
            try:
                self._cursor.execute(sql, values[start:end] if n * width != len(values) else values)
            except Exception as exc:
                raise self._wrap(sql[:200], values[start : start + 3 * width], exc) from exc
            left, start = left - n, end


@cache
def _insert_sql(table: str, columns: str, width: int, rows: int, utf8: tuple[int, ...]) -> str:
    """The text of a SQLite insert of ``rows`` rows (built once: the driver's statement cache keys on it)."""
    one = f"({', '.join('CAST(? AS TEXT)' if i in utf8 else '?' for i in range(width))})"
    return f"INSERT INTO {table} ({columns}) VALUES {', '.join([one] * rows)}"
