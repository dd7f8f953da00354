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
from agentforge.types import ResourceVersion, parse_version_number

__all__ = ["AdapterPublisher", "HotSwapPublisher", "StorePublisher", "rollback_adapter", "version_number"]


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


def _adapter_record(adapter_dir: Path, alias: str, step: int, **extra: object) -> ResourceVersion:
    info = read_adapter(adapter_dir)
    payload = {"path": str(Path(adapter_dir).resolve()), "base_model": info.base_model, "rank": info.max_rank}
    return ResourceVersion(name=alias, kind="adapter", payload={**payload, "step": step, **extra})


class StorePublisher:
    """Out-of-process publisher: record the adapter as the store's new active version and let serving follow.

    For jobs that run away from the serving process (trace replay, a trainer on another machine): the new
    version is activated in the store at once; every ``agentforge serve`` (or :class:`~agentforge.serving.
    follow.StoreFollower`) watching the same store hot-swaps it in within its poll interval, canary first.
    If the canary fails there, serving keeps the old version and logs why; the store still names the new one
    as active, so fix or roll back with :func:`rollback_adapter`.

    Args:
        store: the trace store serving follows.
        alias: the model alias (resource name), ``"policy"``.

    Raises (``publish``): ``UserError``/``AdapterIncompatibleError`` when the directory is not a LoRA adapter.
    """

    def __init__(self, store: TraceStore, alias: str = "policy") -> None:
        self.store, self.alias = store, alias

    def current(self) -> str:
        """The store's active version (``policy@v0``, the base model, when none was published)."""
        try:
            return self.store.get_resource(self.alias).ref
        except NotFoundError:
            return f"{self.alias}@v0"

    def publish(self, adapter_dir: Path, step: int) -> str:
        return self.store.publish_resource(_adapter_record(adapter_dir, self.alias, step), activate=True).ref


def rollback_adapter(store: TraceStore, version: int | str, alias: str = "policy") -> ResourceVersion:
    """Serve an earlier adapter version again, in one call.

    Serving never reloads an old version name (stale-weight risk, DESIGN fact 2), so the rollback publishes
    the earlier version's adapter as a **new** version (payload copied, ``rollback_of`` recorded) and
    activates it; followers hot-swap it like any other. ``version`` 0 (or ``"policy@v0"``) is the base model:
    the base is served again by activating nothing new — the follower swaps back to ``{alias}@v0``.

    Args:
        store: the trace store.
        version: the version to restore: ``3``, ``"3"``, ``"v3"`` or ``"policy@v3"``.
        alias: the model alias (resource name).

    Returns:
        The new active resource (for version 0: a new version whose payload marks the base model).

    Raises:
        NotFoundError: the version does not exist.
        UserError: the version string cannot be parsed.
    """
    number = parse_version_number(version, name=alias)
    if number == 0:
        payload: dict[str, object] = {"base": True, "rollback_of": 0}
    else:
        old = store.get_resource(alias, number)
        payload = {**old.payload, "rollback_of": number}
    return store.publish_resource(ResourceVersion(name=alias, kind="adapter", payload=payload), activate=True)
