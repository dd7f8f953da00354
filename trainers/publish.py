"""Publishing trained adapters: record a new version in the store, hot-swap it into serving.

The store is the source of truth for the version lineage: the store numbers adapter versions
(``policy@v1``, ``policy@v2``, …), serving loads each under that new name (never an old one, DESIGN fact
2), and the resource is activated only after the canary passed and the alias flipped. A trainer that
restarts reads the lineage back from the store, so versions continue instead of starting over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from agentforge.errors import NotFoundError
from agentforge.gateway.router import ModelRouter
from agentforge.serving.adapters import read_adapter
from agentforge.serving.hotswap import HotSwapper
from agentforge.stores.base import TraceStore
from agentforge.types import ResourceVersion

__all__ = ["AdapterPublisher", "HotSwapPublisher", "version_number"]


def version_number(version: str) -> int:
    """``"policy@v7"`` → 7; ``"policy"`` or anything without ``@vN`` → 0 (the base model)."""
    _, _, tail = version.rpartition("@v")
    return int(tail) if tail.isdigit() else 0


@runtime_checkable
class AdapterPublisher(Protocol):
    """Where the trainer sends each new adapter. ``publish`` blocks until the new version serves."""

    def current(self) -> str:
        """The version the alias serves now (``policy@v0`` = base model)."""
        ...

    def publish(self, adapter_dir: Path, step: int) -> str:
        """Make the adapter at ``adapter_dir`` the served version; return its versioned name.

        Raises: ``AdapterIncompatibleError`` (refused before loading), ``ServingError`` (load/canary failed;
        the previous version keeps serving).
        """
        ...


class HotSwapPublisher:
    """In-process publisher: the trainer, the serving engine and the gateway's router share a process.

    Args:
        swapper: the :class:`HotSwapper` of the serving engine.
        store: the trace store that keeps the version lineage (resource named ``swapper.alias``).
    """

    def __init__(self, swapper: HotSwapper, store: TraceStore) -> None:
        self.swapper, self.store = swapper, store

    @property
    def router(self) -> ModelRouter:
        """The router whose alias this publisher moves."""
        return self.swapper.router

    def current(self) -> str:
        version = self.router.alias(self.swapper.alias)
        return version or self.swapper.register_base()

    def publish(self, adapter_dir: Path, step: int) -> str:
        info = read_adapter(adapter_dir)
        record = self.store.publish_resource(
            ResourceVersion(
                name=self.swapper.alias,
                kind="adapter",
                payload={
                    "path": str(adapter_dir),
                    "base_model": info.base_model,
                    "rank": info.max_rank,
                    "step": step,
                },
            ),
            activate=False,
        )
        version = self.swapper.swap(adapter_dir, version=record.ref)
        self.store.activate_resource(record.name, record.version)
        return version

    def restore(self) -> str:
        """Serve the store's active adapter version again (after a restart); returns the version served.

        If the alias already serves it, nothing happens. With no adapter in the store, the base model
        (``{alias}@v0``) is registered and served.
        """
        self.swapper.register_base()
        try:
            active = self.store.get_resource(self.swapper.alias)
        except NotFoundError:  # nothing published yet: serve what the alias points at (the base by default)
            return self.current()
        if self.router.alias(self.swapper.alias) == active.ref:
            return active.ref
        return self.swapper.swap(active.payload["path"], version=active.ref)
