"""What the promotion gate moves: one lineage's served version, wherever it is served from.

:class:`~agentforge.serving.promoter.GatedPublisher` runs the gate (eval → traffic canary → promote → watch and
rollback) once, for every lineage; a :class:`Lineage` says how that lineage's versions are loaded, put on a canary,
made the default and taken back:

* :class:`SwapperLineage` — the shared policy of an in-process engine (:class:`~agentforge.serving.hotswap.
  HotSwapper`): a candidate is loaded beside the live version, promotion and rollback are alias flips.
* :class:`StoreLineage` — a lineage that serving reads from the store (an ``agentforge serve`` following it, or a
  tenant's lineage in another process): promotion and rollback are store activations; no traffic canary (nothing
  here can send live traffic to the candidate).
* :class:`TenantLineage` — a tenant's own lineage ``policy@<tenant>`` served on demand by :class:`~agentforge.
  serving.tenants.TenantAdapters` in this process: a store lineage whose candidate is loaded into the engine and
  can take a sticky share of *that tenant's* live rollouts (the router's canary behind ``policy@<tenant>``,
  consulted by the gateway only for that tenant's rollouts), judged on that tenant's live rewards only.

A rollback makes the previous version the store's active one again; when that previous version is not of the
lineage (a tenant that had no adapter of its own was served the shared policy) or is the base model, a version
marking the base is activated (``{"base": True}``), exactly as ``agentforge rollback ... 0`` does.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from agentforge.errors import NotFoundError, ServingError
from agentforge.types import ResourceVersion, Version

if TYPE_CHECKING:
    from agentforge.gateway.router import ModelRouter
    from agentforge.ports import TraceStore
    from agentforge.serving.hotswap import HotSwapper
    from agentforge.serving.tenants import TenantAdapters

__all__ = ["Lineage", "SwapperLineage", "StoreLineage", "TenantLineage", "activate_version"]

log = logging.getLogger(__name__)


class Lineage(Protocol):
    """One lineage as the promotion gate moves it.

    Attributes:
        alias: the store resource its versions are records of (``policy``, ``policy@acme``).
        model: the alias live calls ask for (``policy``); rollouts pinning it are not live traffic.
        tenant: whose live rollouts count for its live reward (``None``: everyone's).
        router: where a traffic canary is set behind :attr:`canary_key`; ``None``: no canary is possible.
        canary_key: the router alias the canary is set behind.
        keeps_previous: whether the previous version can serve again after a promotion (needed for a rollback).
    """

    alias: str
    model: str
    tenant: str | None
    router: ModelRouter | None
    canary_key: str
    keeps_previous: bool

    def current(self) -> str:
        """The version serving the lineage's live calls now."""
        ...

    def load(self, adapter_dir: Path, version: str) -> str:
        """Make the recorded ``version`` routable without serving it by default; returns its routable name.

        Raises:
            AdapterIncompatibleError, ServingError: the engine refused it (nothing is served differently).
        """
        ...

    def discard(self, version: str) -> None:
        """Unload a loaded version that is not the default (waits for its in-flight calls; no-op if not loaded)."""
        ...

    def reload(self, version: str) -> None:
        """Make a version :meth:`load` loaded routable again if serving unloaded it since (a tenant's candidate
        evicted by other tenants' cold starts during its eval gate); the gate calls it before the canary.

        Raises:
            AdapterIncompatibleError, ServingError: the engine refused it.
        """
        ...

    def promote(self, version: str, *, rollback: bool = False) -> None:
        """Serve ``version`` by default and make it the store's active version (``rollback``: the version served
        before is retired, not kept)."""
        ...


def activate_version(store: TraceStore, alias: str, version: str) -> None:
    """Make ``version`` the store's active version of ``alias``; a version of another resource (the shared policy
    behind a tenant's lineage) or the base model (``…@v0``) activates a new version marking the base.

    Raises:
        NotFoundError: ``version`` names a version of ``alias`` that is not stored.
    """
    parsed = Version.parse(version)
    if parsed.name == alias and parsed.number > 0:
        store.activate_resource(alias, parsed.number)
        return
    base = ResourceVersion(name=alias, kind="adapter", payload={"base": True, "rollback_of": 0})
    store.publish_resource(base, activate=True)


class SwapperLineage:
    """The lineage of an in-process engine's alias, moved by its :class:`HotSwapper` (see the module docstring).

    Args:
        swapper: the hot swapper of the alias; a rollback needs ``retain >= 1`` (the previous version stays loaded).
        store: where versions are recorded and activated.
    """

    tenant: str | None = None

    def __init__(self, swapper: HotSwapper, store: TraceStore) -> None:
        self.swapper, self.store = swapper, store
        self.alias = self.model = self.canary_key = swapper.alias
        self.router: ModelRouter | None = swapper.router
        self.keeps_previous = swapper.retain >= 1

    def current(self) -> str:
        """The version the alias points at (``{alias}@v0``, the base model, registered if nothing is)."""
        return self.swapper.router.alias(self.alias) or self.swapper.register_base()

    def load(self, adapter_dir: Path, version: str) -> str:
        return self.swapper.swap(adapter_dir, version=version, flip=False)

    def discard(self, version: str) -> None:
        self.swapper.discard(version)

    def reload(self, version: str) -> None:
        return None  # the swapper unloads only versions it retires or discards

    def promote(self, version: str, *, rollback: bool = False) -> None:
        self.swapper.promote(version, retire_old=rollback)  # one flip; the old version drains first
        activate_version(self.store, self.alias, version)


class StoreLineage:
    """A lineage served from the store by whoever follows it; moves are store activations (module docstring).

    Args:
        store: where versions are recorded and activated.
        alias: the lineage (``policy``, ``policy@acme``).
        fallback: the version serving while the lineage has no active adapter (a tenant without one is served the
            shared ``policy@v0``); ``None``: ``<alias>@v0`` (or ``<alias>/v0`` for a tenant lineage).
    """

    router: ModelRouter | None = None
    keeps_previous = True  # the previous version's adapter stays on disk; serving loads it again on demand

    def __init__(self, store: TraceStore, alias: str, fallback: str | None = None) -> None:
        self.store, self.alias, self.fallback = store, alias, fallback
        self.model, _, tenant = alias.partition("@")
        self.tenant: str | None = tenant or None
        self.canary_key = alias

    def current(self) -> str:
        """The lineage's active version; when it has none, or the active one marks the base: :meth:`shared`."""
        try:
            active = self.store.get_resource(self.alias)
        except NotFoundError:
            return self.shared()
        return self.shared() if active.payload.get("base") else active.ref

    def shared(self) -> str:
        """What serves the lineage when it has no adapter of its own: ``fallback``, else its version 0."""
        return self.fallback or str(Version(self.alias, 0))

    def load(self, adapter_dir: Path, version: str) -> str:
        return version  # serving loads it from the store's record when a call needs it

    def discard(self, version: str) -> None:
        return None  # never loaded here

    def reload(self, version: str) -> None:
        return None  # never loaded here

    def promote(self, version: str, *, rollback: bool = False) -> None:
        activate_version(self.store, self.alias, version)


class TenantLineage(StoreLineage):
    """A tenant's own lineage served by :class:`TenantAdapters` in this process (module docstring): its candidate is
    loaded into the engine, can serve a sticky share of the tenant's live rollouts, and a promotion or rollback is
    seen by the tenant's next call (the adapters' cached active version is dropped).

    Args:
        adapters: serving's tenant adapters (their router is the gateway's).
        store: where the lineage's versions are recorded (the store ``adapters`` reads).
        tenant: the tenant.
    """

    def __init__(self, adapters: TenantAdapters, store: TraceStore, tenant: str) -> None:
        super().__init__(store, Version.lineage(adapters.alias, tenant))
        self.adapters, self.router = adapters, adapters.router

    def shared(self) -> str:
        """The shared alias's version now (a tenant without an adapter of its own is served it)."""
        return self.adapters.router.resolve(self.model)[0]

    def load(self, adapter_dir: Path, version: str) -> str:
        self.adapters.preload(self.tenant or "", version)
        return version

    def discard(self, version: str) -> None:
        self.adapters.unload(version)

    def reload(self, version: str) -> None:
        self.adapters.preload(self.tenant or "", version)  # the router's canary needs it registered

    def promote(self, version: str, *, rollback: bool = False) -> None:
        """Activate ``version`` and drop the adapters' cached active version, so the tenant's next call is served
        by it; on a rollback the version rolled back from is then unloaded once its in-flight calls finished."""
        old = self.current() if rollback else None
        super().promote(version, rollback=rollback)
        self.adapters.refresh(self.tenant or "")
        if old is not None and old != version and Version.parse(old).name == self.alias:
            try:
                self.adapters.unload(old)
            except ServingError as exc:  # it stays loaded until evicted; the rollback itself is done
                log.warning("rolled back from %s, which could not be unloaded yet: %s", old, exc)
