"""The in-process adapter publisher: record a new version in the store, hot-swap it into serving.

:class:`HotSwapPublisher` implements the :class:`~agentforge.ports.AdapterPublisher` port for a trainer that
shares a process with the serving engine and the gateway's router. It lives in the serving layer because
only serving changes what is served (DESIGN fact 7): the trainer calls ``publish``; the
:class:`~agentforge.serving.hotswap.HotSwapper` loads, canaries and moves the alias.

The store is the source of truth for the version lineage: the store numbers adapter versions
(``policy@v1``, ``policy@v2``, …), serving loads each under that new name (never an old one, DESIGN fact
2), and the resource is activated only after the canary passed and the alias flipped.
"""

from __future__ import annotations

import time
from pathlib import Path

from agentforge.errors import NotFoundError
from agentforge.gateway.router import ModelRouter
from agentforge.ports import TraceStore
from agentforge.serving.adapters import read_adapter
from agentforge.serving.hotswap import HotSwapper
from agentforge.types import ResourceVersion

__all__ = ["HotSwapPublisher"]


class HotSwapPublisher:
    """In-process publisher: the trainer, the serving engine and the gateway's router share a process.

    Args:
        swapper: the :class:`HotSwapper` of the serving engine.
        store: the trace store that keeps the version lineage (resource named ``swapper.alias``).
    """

    def __init__(self, swapper: HotSwapper, store: TraceStore) -> None:
        self.swapper, self.store = swapper, store
        #: seconds from the start of the last :meth:`publish` to each stage: ``recorded`` (the store holds the
        #: inactive version), the swap's stages (:attr:`HotSwapper.last_stages`), ``activated``
        self.last_stages: dict[str, float] = {}

    @property
    def router(self) -> ModelRouter:
        """The router whose alias this publisher moves."""
        return self.swapper.router

    def current(self) -> str:
        version = self.router.alias(self.swapper.alias)
        return version or self.swapper.register_base()

    def publish(self, adapter_dir: Path, step: int) -> str:
        """Record, hot-swap and then activate the adapter; the store keeps its absolute, resolved path, so
        an ``agentforge serve`` started from another directory loads the same files."""
        t0 = time.perf_counter()
        adapter_dir = Path(adapter_dir).resolve()
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
        recorded = time.perf_counter() - t0
        version = self.swapper.swap(adapter_dir, version=record.ref)
        stages = {k: recorded + v for k, v in self.swapper.last_stages.items()}
        self.store.activate_resource(record.name, record.version)
        self.last_stages = {"recorded": recorded, **stages, "activated": time.perf_counter() - t0}
        return version

    def restore(self) -> str:
        """Serve the store's active adapter version again (after a restart); returns the version served.

        If the alias already serves it, nothing happens. With no adapter in the store, or when the active record
        marks the base model (``{"base": True}``, a rollback to version 0), the base model (``{alias}@v0``) is
        registered and served.
        """
        self.swapper.register_base()
        try:
            active = self.store.get_resource(self.swapper.alias)
        except NotFoundError:  # nothing published yet: serve what the alias points at (the base by default)
            return self.current()
        if self.router.alias(self.swapper.alias) == active.ref:
            return active.ref
        if active.payload.get("base"):  # a rollback to the base model (rollback_adapter, GatedPublisher)
            return self.swapper.reset_to_base()
        return self.swapper.swap(active.payload["path"], version=active.ref)
