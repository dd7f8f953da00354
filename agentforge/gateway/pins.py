"""Rollout pins: the version each rollout asked the gateway to serve it with (``Rollout.resources``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentforge.errors import NotFoundError
from agentforge.types import tenant_of_name

if TYPE_CHECKING:
    from agentforge.gateway.router import ModelRouter
    from agentforge.ports import TraceStore

__all__ = ["PinCache"]

logger = logging.getLogger("agentforge.gateway")


class PinCache:
    """Each rollout's pins, read from the store once per rollout (at most ``size`` rollouts kept, oldest
    evicted first). Safe to use from worker threads.

    Args:
        store: where rollouts are read (``get_rollout``).
        router: tells whether a pinned version is still served.
        size: most rollouts cached.
    """

    def __init__(self, store: TraceStore, router: ModelRouter, size: int = 4096) -> None:
        self.store, self.router, self._size = store, router, size
        self._pins: dict[str, dict[str, str]] = {}
        self._owners: dict[str, str | None] = {}  # rollout → its tenant (kept beside its pins)
        self._lock = threading.Lock()
        #: a pin of a tenant lineage (``policy@acme/v3``) is served even when not loaded: serving loads it on
        #: demand (the gateway sets this when it has serving's tenant adapters)
        self.loads_tenants = False
        #: ``own_lineage(tenant, model)``: whether the tenant's calls for ``model`` are served a version of its own
        #: lineage; such a tenant's rollouts never meet the canary behind ``model`` (the gateway sets it from
        #: serving's tenant adapters; ``None``: every rollout may)
        self.own_lineage: Callable[[str, str], bool] | None = None

    def __contains__(self, rollout_id: object) -> bool:
        return rollout_id in self._pins

    def owner(self, rollout_id: str) -> str | None:
        """The tenant of a rollout :meth:`target` has read (``None``: no tenant, or not read: unknown)."""
        return self._owners.get(rollout_id)

    def known(self, rollout_id: str) -> bool:
        """Whether the store holds ``rollout_id`` (read once and cached with its pins; :meth:`owner` then
        names its tenant). Reads the store: call it from a worker thread."""
        return self._load(rollout_id) is not None

    def _load(self, rollout_id: str) -> dict[str, str] | None:
        """The rollout's pins, read from the store on the first call; ``None``: no such rollout."""
        resources = self._pins.get(rollout_id)
        if resources is None:
            try:
                rollout = self.store.get_rollout(rollout_id)
            except Exception:  # unknown or malformed id
                return None
            resources = rollout.resources
            with self._lock:  # lookups run in worker threads
                if len(self._pins) >= self._size:
                    self._owners.pop(oldest := next(iter(self._pins)), None)
                    self._pins.pop(oldest, None)
                self._pins[rollout_id], self._owners[rollout_id] = resources, rollout.tenant
        return resources

    def target(self, rollout_id: str, model: str) -> str:
        """The version a rollout pinned for ``model`` (``Rollout.resources[model]``), else ``model``.

        A rollout enqueued by the trainer pins ``{"policy": "policy@v3"}`` so every call of that rollout is
        served by the version it was sampled for, even if the alias flips mid-rollout. A pin whose version
        is no longer routable (already unloaded) falls back to the alias, logged. Lookups are cached per
        rollout (a rollout's pins do not change while it runs). An unpinned rollout goes to the router's
        canary version when one runs behind ``model`` and the rollout falls in its share.
        """
        resources = self._load(rollout_id)
        if resources is None:  # unknown or malformed id: the span becomes an orphan later
            return model
        pinned = resources.get(model)
        if pinned is None:  # a traffic canary behind the alias may take this rollout (sticky by id)
            return self._canary(rollout_id, model) or model
        if self.loads_tenants and tenant_of_name(pinned) is not None:
            return pinned
        try:
            self.router.resolve(pinned)
        except NotFoundError:
            logger.warning(
                "rollout %s pins %s=%s, which is not served any more; using the alias",
                rollout_id,
                model,
                pinned,
            )
            return model
        return pinned

    def _canary(self, rollout_id: str, model: str) -> str | None:
        """The canary version for an unpinned rollout, or ``None``: a tenant's rollout first meets the canary behind
        its own lineage (``policy@acme``, :class:`~agentforge.serving.lineage.TenantLineage`), which no other
        tenant's rollout ever consults; then the canary behind ``model`` itself, unless the tenant is served an
        adapter of its own (:attr:`own_lineage`): the shared candidate would replace it, and be judged against
        the shared version on traffic that version does not serve."""
        owner = self._owners.get(rollout_id)
        if owner is None or "@" in model:
            return self.router.canary_target(model, rollout_id)
        lineage = self.router.canary_target(f"{model}@{owner}", rollout_id)
        if lineage is not None:
            return lineage
        shared = self.router.canary_target(model, rollout_id)
        if shared is None or self.own_lineage is None or not self.own_lineage(owner, model):
            return shared
        return None
