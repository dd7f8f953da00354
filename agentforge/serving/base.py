"""The ``PolicyServer`` protocol: an inference engine that serves a base model plus LoRA adapters.

Contract:

* ``start``/``stop`` block until the engine is healthy / gone; ``stop`` is safe twice.
* ``load_adapter`` validates first (base model, LoRA rank against the server maximum) and raises
  ``AdapterIncompatibleError`` *before touching the engine*; every load uses a **new** name
  (``policy@v8``), never an in-place reload under an old name (vLLM's prefix cache would serve the old
  adapter's KV).
* ``unload_adapter`` of an unknown name raises ``NotFoundError``.
* Engine failures raise ``ServingError``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["PolicyServer"]


@runtime_checkable
class PolicyServer(Protocol):
    """An OpenAI-compatible engine with runtime LoRA loading."""

    base_model: str
    max_lora_rank: int

    @property
    def base_url(self) -> str:
        """OpenAI-compatible base URL ending in ``/v1``."""
        ...

    @property
    def base_model_name(self) -> str:
        """The model name the engine serves the base weights under."""
        ...

    def start(self) -> None:
        """Start the engine and block until it answers its health check. Raises: ``ServingError``."""
        ...

    def stop(self) -> None:
        """Stop the engine and free its resources."""
        ...

    def load_adapter(self, name: str, path: str) -> None:
        """Load the PEFT adapter at ``path`` under the new name ``name``.

        Raises: ``AdapterIncompatibleError`` (checked before loading), ``ServingError``.
        """
        ...

    def unload_adapter(self, name: str) -> None:
        """Unload a previously loaded adapter. Raises: ``NotFoundError``, ``ServingError``."""
        ...

    def adapters(self) -> list[str]:
        """Names of the adapters currently loaded."""
        ...
