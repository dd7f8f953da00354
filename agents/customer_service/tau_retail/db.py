"""The τ-retail database: one read-only snapshot shared by all rollouts, one copy-on-write view per rollout.

τ-bench gives every episode a fresh deep copy of ``{"orders", "products", "users"}`` (3.6 MB of JSON).
A ``copy.deepcopy`` of it costs about 110 ms and hashing it (``json.dumps(..., sort_keys=True)`` then
SHA-256) about 35 ms, which dominates a training step that scores hundreds of rollouts. Here:

* :class:`RetailData` holds the loaded tables once, never mutated, plus the canonical JSON dump of every
  record (computed once at load).
* :class:`RetailDB` is one rollout's view: reads go to the snapshot, the first write to a record deep-copies
  that record alone into the view's overlay. Creating a view is O(1); rollouts never see each other's writes.
* :meth:`RetailDB.db_hash` re-serialises only the overlaid records and hashes the concatenation; the result
  is byte-for-byte ``sha256(json.dumps(data, sort_keys=True))``, the benchmark's definition (a test pins
  the equality on mutated views).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

from agentforge.agents.customer_service.tau_retail.tools import call_tool, tool_schemas
from agentforge.errors import UserError

__all__ = ["TABLES", "RetailData", "RetailDB", "canonical_hash"]

#: The three tables of the τ-retail database, each a JSON object keyed by id.
TABLES: tuple[str, ...] = ("orders", "products", "users")

Record = dict[str, Any]


def canonical_hash(data: Mapping[str, Any]) -> str:
    """Return the benchmark's database hash: SHA-256 hex digest of ``json.dumps(data, sort_keys=True)``.

    Args:
        data: the full database, e.g. ``{"orders": {...}, "products": {...}, "users": {...}}``.

    Returns:
        64 lowercase hex characters.
    """
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()


def _entry(key: str, record_dump: str) -> str:
    # One "key: value" member of a sorted JSON object, exactly as json.dumps writes it (default separators).
    return f"{json.dumps(key)}: {record_dump}"


class RetailData:
    """The read-only snapshot of the τ-retail tables, shared by every :class:`RetailDB` made from it.

    Nothing in agentforge mutates it; callers must not either (use :meth:`snapshot` for a private copy).
    Loading the real data and building the dump cache takes about 0.1 s; do it once per process
    (:func:`~agentforge.agents.customer_service.tau_retail.load_tau_retail` caches it).

    Args:
        tables: ``{"orders": {order_id: record}, "products": {...}, "users": {...}}``.

    Raises:
        UserError: a table is missing or is not a JSON object keyed by string ids.
    """

    def __init__(self, tables: Mapping[str, Mapping[str, Record]]) -> None:
        missing = [name for name in TABLES if name not in tables]
        if missing or set(tables) != set(TABLES):
            raise UserError(f"τ-retail data needs exactly the tables {list(TABLES)}; got {sorted(tables)}")
        self._tables: dict[str, dict[str, Record]] = {}
        self._keys: dict[str, list[str]] = {}
        self._position: dict[str, dict[str, int]] = {}
        self._entries: dict[str, list[str]] = {}
        self._joined: dict[str, str] = {}
        for name in TABLES:
            table = tables[name]
            if not isinstance(table, Mapping) or not all(isinstance(k, str) for k in table):
                raise UserError(f"τ-retail table {name!r} must be a JSON object keyed by string ids")
            self._tables[name] = dict(table)
            keys = sorted(table)
            self._keys[name] = keys
            self._position[name] = {key: i for i, key in enumerate(keys)}
            self._entries[name] = [_entry(key, json.dumps(table[key], sort_keys=True)) for key in keys]
            self._joined[name] = ", ".join(self._entries[name])
        self.base_hash = self._hash({})

    def get(self, table: str, key: str) -> Record | None:
        """Return the shared record (not a copy; do not mutate it) or ``None`` if the id is unknown."""
        return self._tables[table].get(key)

    def items(self, table: str) -> Iterator[tuple[str, Record]]:
        """Iterate ``(id, record)`` in the file's order (shared records; do not mutate them)."""
        return iter(self._tables[table].items())

    def __len__(self) -> int:
        return sum(len(t) for t in self._tables.values())

    def snapshot(self) -> dict[str, dict[str, Record]]:
        """Return a private deep copy of all tables (about 0.1 s; for inspection, not per rollout)."""
        return copy.deepcopy(self._tables)

    def new_db(self) -> RetailDB:
        """Return a fresh copy-on-write view of this snapshot (O(1))."""
        return RetailDB(self)

    def _hash(self, overlay: Mapping[str, Mapping[str, Record]]) -> str:
        """SHA-256 of ``json.dumps(merged, sort_keys=True)`` where ``overlay`` replaces snapshot records."""
        digest = hashlib.sha256()
        for i, name in enumerate(TABLES):  # TABLES is sorted, as sort_keys orders the top level
            digest.update(f"{', ' if i else '{'}{json.dumps(name)}: {{".encode())
            changed = overlay.get(name)
            if not changed:
                digest.update(self._joined[name].encode())
            else:
                entries = list(self._entries[name])
                position = self._position[name]
                for key, record in changed.items():
                    entries[position[key]] = _entry(key, json.dumps(record, sort_keys=True))
                digest.update(", ".join(entries).encode())
            digest.update(b"}")
        digest.update(b"}")
        return digest.hexdigest()


class RetailDB:
    """One rollout's private, copy-on-write view of a :class:`RetailData` snapshot.

    Reads return the snapshot's record unless this view has written it; :meth:`writable` copies a record
    into the view before the first write. The tools in :mod:`.tools` are the only writers; agents reach
    them through :meth:`call_tool`, which never raises for an agent's mistake.

    Not thread-safe: one view belongs to one rollout.

    Args:
        data: the shared snapshot.
    """

    def __init__(self, data: RetailData) -> None:
        self.data = data
        self._overlay: dict[str, dict[str, Record]] = {name: {} for name in TABLES}

    # -- record access used by the tools -------------------------------------------------------------

    def get(self, table: str, key: Any) -> Record | None:
        """Return the current record for ``key`` (read-only by contract) or ``None`` if unknown."""
        if not isinstance(key, str):
            return None
        record = self._overlay[table].get(key)
        return record if record is not None else self.data.get(table, key)

    def writable(self, table: str, key: str) -> Record:
        """Return this view's own copy of the record, copying it from the snapshot on first write.

        Raises:
            KeyError: the id does not exist (tools check existence first).
        """
        record = self._overlay[table].get(key)
        if record is None:
            base = self.data.get(table, key)
            if base is None:
                raise KeyError(f"{table} has no id {key!r}")
            record = copy.deepcopy(base)
            self._overlay[table][key] = record
        return record

    def items(self, table: str) -> Iterator[tuple[str, Record]]:
        """Iterate the current ``(id, record)`` pairs in the snapshot's order."""
        overlay = self._overlay[table]
        for key, record in self.data.items(table):
            yield key, overlay.get(key, record)

    # -- public API ----------------------------------------------------------------------------------

    def call_tool(self, name: str, arguments: Mapping[str, Any] | str | None = None) -> str:
        """Run one retail tool and return its output string (``"Error: ..."`` for a bad call; never raises).

        Args:
            name: a tool name from :func:`~.tools.tool_schemas`.
            arguments: the tool's keyword arguments, as a dict or as the JSON string the model emitted.

        Returns:
            The tool output exactly as τ-bench returns it (JSON of the record for lookups and writes).
        """
        return call_tool(self, name, arguments)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The 16 OpenAI function schemas (see :func:`~.tools.tool_schemas`)."""
        return tool_schemas()

    def db_hash(self) -> str:
        """SHA-256 hex digest of ``json.dumps(data, sort_keys=True)`` of this view (about 3 ms)."""
        if not any(self._overlay.values()):
            return self.data.base_hash
        return self.data._hash(self._overlay)

    def record(self, table: str, key: str) -> Record | None:
        """Return a deep copy of the current record (safe to mutate), or ``None`` if unknown."""
        record = self.get(table, key)
        return copy.deepcopy(record) if record is not None else None

    def changed(self) -> dict[str, list[str]]:
        """The ids this view has written, per table (a written record may still equal the snapshot)."""
        return {name: sorted(rows) for name, rows in self._overlay.items() if rows}

    def to_dict(self) -> dict[str, dict[str, Record]]:
        """Return a deep copy of the whole current database (about 0.1 s; for inspection and tests)."""
        return {name: {key: copy.deepcopy(record) for key, record in self.items(name)} for name in TABLES}

    def fork(self) -> RetailDB:
        """Return an independent view that starts from this view's current state."""
        twin = RetailDB(self.data)
        twin._overlay = {name: copy.deepcopy(rows) for name, rows in self._overlay.items()}
        return twin
