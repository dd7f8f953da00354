"""``MemoryStore``: conversation memories that many processes write and read, in one Chroma collection.

Chroma's local (persistent) mode is not process-safe: each process keeps its own in-memory index and
flushes it to the same files, so two writer processes lose or corrupt each other's vectors. The design
here makes **one writer at a time own the collection** and gives every memory a durable home first:

* **Journal.** :meth:`MemoryStore.add` writes the memory to ``journal.sqlite3`` (SQLite in WAL mode,
  which *is* multi-process safe) and returns once it is committed. It never opens Chroma and never
  loads the embedding model, so any number of writer processes can add at once and nothing is lost if
  indexing fails or the process dies.
* **Owner.** Every Chroma access (indexing pending memories, querying, counting) happens inside an
  exclusive inter-process lock on ``chroma.lock``. The lock holder opens a *fresh* Chroma client on
  ``chroma/``, embeds and upserts the journal's unindexed memories (by memory id), marks them indexed,
  queries if asked, and closes the client, so its in-memory state dies with the section and the next
  owner (any process) reads the files as the last owner left them. No two processes ever have Chroma
  open on the directory at the same time.
* **Idempotent.** Upserts are keyed by memory id; a crash between the upsert and the journal update
  re-upserts the same ids next time (no duplicates). :meth:`MemoryStore.search` indexes pending memories
  first, so a memory is queryable as soon as its ``add`` returned.

The test ``tests/test_cs_knowledge.py`` runs four writer processes (25 memories each) and one reader on
the same directory and checks that all 100 are queryable and the collection holds exactly 100.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentforge.agents.customer_service.embeddings import (
    LocalEmbedder,
    chroma_client,
    chroma_embedding_function,
    local_model_path,
    shared_embedder,
)
from agentforge.errors import MissingExtraError, StoreError
from agentforge.types import new_id

__all__ = ["Memory", "MemoryStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    memory_id TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created_at REAL NOT NULL,
    indexed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS memories_pending ON memories (indexed);
"""

Scalar = str | int | float | bool


@dataclass(frozen=True)
class Memory:
    """One stored memory.

    Attributes:
        memory_id: its id (caller-supplied or ``mem-<hex>``).
        text: the remembered text.
        metadata: flat metadata (``str``/``int``/``float``/``bool`` values).
        distance: cosine distance to the query (search results only), 0 = identical.
    """

    memory_id: str
    text: str
    metadata: dict[str, Scalar] = field(default_factory=dict)
    distance: float | None = None


class MemoryStore:
    """Conversation memories in a journal plus one Chroma collection (see the module docstring).

    Args:
        path: the store's directory (created); holds ``journal.sqlite3``, ``chroma/``, ``chroma.lock``.
        collection: the Chroma collection name.
        embedder: the embedder used when indexing (default: the process-wide shared one, loaded on the
            first index/search, never by :meth:`add`).
        lock_timeout_s: seconds to wait for the owner lock before raising ``StoreError``.

    Raises:
        EmbeddingModelMissingError: the offline embedding model package is missing (checked at start-up,
            so no memory is accepted that could never be indexed).
        MissingExtraError: ``filelock`` is not installed.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        collection: str = "memories",
        embedder: LocalEmbedder | None = None,
        lock_timeout_s: float = 120.0,
    ) -> None:
        try:
            from filelock import FileLock
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingExtraError("filelock", "agents", "MemoryStore") from exc
        self._model_path = embedder.model_path if embedder is not None else local_model_path()
        self._embedder = embedder
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.collection, self.lock_timeout_s = collection, lock_timeout_s
        self._owner = FileLock(str(self.path / "chroma.lock"))
        self._thread_lock = threading.RLock()
        with self._journal() as db:
            db.executescript(_SCHEMA)

    # --- journal (any process) -------------------------------------------------------------------
    @contextmanager
    def _journal(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path / "journal.sqlite3", timeout=60.0, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA busy_timeout=60000")
            yield db
        finally:
            db.close()

    def add(
        self, text: str, *, memory_id: str | None = None, metadata: Mapping[str, Scalar] | None = None
    ) -> str:
        """Store a memory durably (journal only; indexing happens at the next :meth:`flush`/:meth:`search`).

        Idempotent by ``memory_id``: adding an existing id keeps the stored memory unchanged.

        Args:
            text: the memory text.
            memory_id: its id (default: a fresh ``mem-<hex>``).
            metadata: flat metadata (values ``str``/``int``/``float``/``bool``).

        Returns:
            The memory id.

        Raises:
            StoreError: the journal could not be written (after SQLite's 60 s busy timeout).
        """
        memory_id = memory_id or new_id("mem")
        meta = json.dumps(dict(metadata or {}), sort_keys=True)
        try:
            with self._journal() as db:
                db.execute(
                    "INSERT OR IGNORE INTO memories (memory_id, text, metadata, created_at) VALUES (?, ?, ?, ?)",
                    (memory_id, text, meta, time.time()),
                )
        except sqlite3.Error as exc:
            raise StoreError(
                f"could not write memory {memory_id} to {self.path / 'journal.sqlite3'}: {exc}"
            ) from exc
        return memory_id

    def pending(self) -> int:
        """Memories written but not yet indexed in Chroma."""
        with self._journal() as db:
            return int(db.execute("SELECT COUNT(*) FROM memories WHERE indexed = 0").fetchone()[0])

    def journaled(self) -> int:
        """All memories in the journal (indexed or not)."""
        with self._journal() as db:
            return int(db.execute("SELECT COUNT(*) FROM memories").fetchone()[0])

    # --- the owner section (one process at a time) ------------------------------------------------
    @contextmanager
    def _owned(self) -> Iterator[Any]:
        """Hold the owner lock, yield a freshly opened collection, close the client afterwards."""
        from filelock import Timeout

        with self._thread_lock:
            try:
                self._owner.acquire(timeout=self.lock_timeout_s)
            except Timeout as exc:
                raise StoreError(
                    f"memory store {self.path}: no owner lock within {self.lock_timeout_s} s ({exc})"
                ) from exc
            try:
                embedder = self._embedder or shared_embedder(self._model_path)
                client = chroma_client(self.path / "chroma")
                try:
                    yield (
                        client.get_or_create_collection(
                            self.collection, embedding_function=chroma_embedding_function(embedder)
                        ),
                        embedder,
                    )
                finally:
                    client.close()  # type: ignore[attr-defined]  # chromadb's ClientAPI type lacks its clients' close()
            finally:
                self._owner.release()

    def _index_pending(self, collection: Any, embedder: LocalEmbedder, batch: int = 64) -> int:
        total = 0
        while True:
            with self._journal() as db:
                rows = db.execute(
                    "SELECT memory_id, text, metadata, created_at FROM memories WHERE indexed = 0 "
                    "ORDER BY created_at LIMIT ?",
                    (batch,),
                ).fetchall()
            if not rows:
                return total
            ids = [r[0] for r in rows]
            metas = [{**json.loads(r[2]), "created_at": r[3]} for r in rows]
            collection.upsert(
                ids=ids,
                documents=[r[1] for r in rows],
                embeddings=embedder.embed([r[1] for r in rows]),
                metadatas=metas,
            )
            with self._journal() as db:
                db.executemany("UPDATE memories SET indexed = 1 WHERE memory_id = ?", [(i,) for i in ids])
            total += len(ids)

    def flush(self) -> int:
        """Index every pending memory (as the collection's owner for the duration of the call).

        Returns:
            The number of memories indexed now.

        Raises:
            StoreError: the owner lock was not free within ``lock_timeout_s`` seconds.
        """
        with self._owned() as (collection, embedder):
            return self._index_pending(collection, embedder)

    def search(self, query: str, k: int = 4, where: Mapping[str, Scalar] | None = None) -> list[Memory]:
        """Index pending memories, then return the ``k`` nearest to ``query`` (cosine), nearest first.

        Args:
            query: the text to match.
            k: number of results, >= 1.
            where: Chroma metadata filter, e.g. ``{"user_id": "olivia_ito_3591"}``.

        Returns:
            Up to ``k`` memories with their ``distance``.

        Raises:
            StoreError: the owner lock was not free within ``lock_timeout_s`` seconds.
        """
        return self.search_many([query], k, where)[0]

    def search_many(
        self, queries: Sequence[str], k: int = 4, where: Mapping[str, Scalar] | None = None
    ) -> list[list[Memory]]:
        """:meth:`search` for several queries in one owner section: the collection is opened once and the queries
        are embedded in one batch (a reader checking many texts pays one Chroma open, not one per query).

        Returns:
            Per query, in order, up to ``k`` memories nearest first.

        Raises:
            StoreError: the owner lock was not free within ``lock_timeout_s`` seconds.
        """
        if not queries:
            return []
        with self._owned() as (collection, embedder):
            self._index_pending(collection, embedder)
            n = min(max(1, k), collection.count())
            if n == 0:
                return [[] for _ in queries]
            out = collection.query(
                query_embeddings=embedder.embed(list(queries)),
                n_results=n,
                where=dict(where) if where else None,
                include=["documents", "metadatas", "distances"],
            )
        return [
            [
                Memory(
                    mid,
                    doc or "",
                    {k_: v for k_, v in (meta or {}).items() if k_ != "created_at"},
                    float(dist),
                )
                for mid, doc, meta, dist in zip(ids, docs, metas, dists, strict=True)
            ]
            for ids, docs, metas, dists in zip(
                out["ids"], out["documents"], out["metadatas"], out["distances"], strict=True
            )
        ]

    def count(self) -> int:
        """Memories in the Chroma collection (after indexing pending ones)."""
        with self._owned() as (collection, embedder):
            self._index_pending(collection, embedder)
            return int(collection.count())
