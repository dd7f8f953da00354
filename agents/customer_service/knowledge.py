"""``PolicyKnowledge``: the retail policy (``wiki.md``) chunked into ChromaDB for retrieval by the agent.

The policy is split by section (``## heading``) into chunks of at most ``max_chars`` characters, each
prefixed with its heading, embedded offline (:mod:`.embeddings`) and upserted under content-hash ids, so
indexing the same policy twice changes nothing. Retrieval returns the ``k`` nearest chunks (cosine).

Concurrency: one ``PolicyKnowledge`` is thread-safe. The policy is static and indexed once; several
processes may *read* the same persistent directory, but only one should index it. Memories written by
many processes go through :class:`~.memory.MemoryStore`, which serialises every Chroma write.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentforge.agents.customer_service.embeddings import (
    LocalEmbedder,
    chroma_client,
    chroma_embedding_function,
    shared_embedder,
)
from agentforge.errors import ConfigError

__all__ = ["chunk_policy", "PolicyKnowledge"]

_HEADING = re.compile(r"^(#{1,6})\s+(.*)$", re.MULTILINE)


def chunk_policy(text: str, max_chars: int = 600) -> list[str]:
    """Split a markdown policy into retrieval chunks.

    Each ``#``/``##`` section is cut at blank lines into pieces of at most ``max_chars`` characters
    (a single paragraph longer than that is cut hard); every piece starts with its section heading so it
    reads on its own.

    Args:
        text: the markdown policy.
        max_chars: the largest chunk, characters (heading included), >= 80.

    Returns:
        The chunks in document order (empty for an empty policy).

    Raises:
        ConfigError: ``max_chars < 80``.
    """
    if max_chars < 80:
        raise ConfigError(f"chunk_policy(max_chars={max_chars}): chunks need at least 80 characters")
    sections: list[tuple[str, str]] = []
    starts = list(_HEADING.finditer(text))
    if not starts or starts[0].start() > 0:
        sections.append(("", text[: starts[0].start()] if starts else text))
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        sections.append((match.group(2).strip(), text[match.end() : end]))
    chunks: list[str] = []
    for heading, body in sections:
        prefix = f"{heading}: " if heading else ""
        budget = max_chars - len(prefix)
        current = ""
        for para in (p.strip() for p in re.split(r"\n\s*\n", body)):
            if not para:
                continue
            while len(para) > budget:
                if current:
                    chunks.append(prefix + current)
                    current = ""
                chunks.append(prefix + para[:budget])
                para = para[budget:]
            if current and len(current) + 1 + len(para) > budget:
                chunks.append(prefix + current)
                current = ""
            current = f"{current}\n{para}" if current else para
        if current:
            chunks.append(prefix + current)
    return chunks


def _doc_id(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


class PolicyKnowledge:
    """Policy chunks in a Chroma collection, searched with offline embeddings.

    Args:
        path: persistent Chroma directory, or ``None`` for an in-memory index (lost at exit).
        collection: the collection name (3-512 characters of ``[a-zA-Z0-9._-]``).
        embedder: the embedder (default: the process-wide :func:`~.embeddings.shared_embedder`).

    Raises:
        EmbeddingModelMissingError: the offline model package is missing (raised here, at start-up,
            before any document is accepted).
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        collection: str = "tau-retail-policy",
        embedder: LocalEmbedder | None = None,
    ) -> None:
        self.embedder = embedder or shared_embedder()
        self.path = Path(path) if path is not None else None
        self._client = chroma_client(self.path)
        self._collection = self._client.get_or_create_collection(
            collection, embedding_function=chroma_embedding_function(self.embedder)
        )
        self._lock = threading.Lock()

    @classmethod
    def from_policy(
        cls, text: str, path: str | Path | None = None, *, max_chars: int = 600, **kwargs: Any
    ) -> PolicyKnowledge:
        """Build the index of a policy text (chunks it with :func:`chunk_policy`, upserts the chunks).

        Args:
            text: the markdown policy (e.g. ``load_tau_retail().wiki``).
            path: persistent directory or ``None`` (in-memory).
            max_chars: chunk size, characters.
            **kwargs: passed to the constructor (``collection``, ``embedder``).

        Returns:
            The knowledge base, holding exactly the policy's chunks (stale chunks of an older policy in
            the same collection are deleted).
        """
        knowledge = cls(path, **kwargs)
        chunks = chunk_policy(text, max_chars)
        ids = knowledge.add_documents(chunks)
        with knowledge._lock:
            stale = [i for i in knowledge._collection.get(include=[])["ids"] if i not in set(ids)]
            if stale:
                knowledge._collection.delete(ids=stale)
        return knowledge

    def add_documents(
        self, texts: Sequence[str], metadatas: Sequence[dict[str, Any]] | None = None
    ) -> list[str]:
        """Embed and upsert documents under content-hash ids (adding the same text twice is a no-op).

        Args:
            texts: the documents.
            metadatas: one flat metadata dict per document, or ``None``.

        Returns:
            The ids, one per text.
        """
        ids = [_doc_id(t) for t in texts]
        if not texts:
            return ids
        vectors = self.embedder.embed(texts)
        with self._lock:
            self._collection.upsert(
                ids=ids,
                documents=list(texts),
                embeddings=vectors,  # type: ignore[arg-type]
                metadatas=list(metadatas) if metadatas else None,
            )
        return ids

    def search(self, query: str, k: int = 2) -> list[str]:
        """The ``k`` chunks nearest to ``query`` (cosine), nearest first.

        Args:
            query: the text to match (e.g. the customer's message plus the triaged intent).
            k: number of chunks, >= 1.

        Returns:
            Up to ``k`` chunk texts (fewer when the index is smaller).
        """
        if not query.strip():
            return []
        (vector,) = self.embedder.embed([query])
        with self._lock:
            n = min(max(1, k), self._collection.count())
            if n == 0:
                return []
            out = self._collection.query(query_embeddings=[vector], n_results=n, include=["documents"])
        return [d for d in (out.get("documents") or [[]])[0] if d]

    def count(self) -> int:
        """Number of chunks indexed."""
        with self._lock:
            return self._collection.count()
