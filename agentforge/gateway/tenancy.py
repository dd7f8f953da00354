"""Tenants at the gateway: who a call is for, which version serves it, and what it may not touch.

A call's tenant comes from its key or, from a caller the gateway already trusts, a header:

* a **tenant key** (:mod:`agentforge.stores.tenants`) presented instead of the gateway key: the key check
  (:class:`~agentforge.gateway.auth.ApiKeyMiddleware`) looks it up and puts the tenant into the ASGI scope
  (:data:`SCOPE_KEY`); an ``X-Tenant`` header naming another tenant is then refused (403);
* the ``X-Tenant`` header (:data:`~agentforge.types.TENANT_HEADER`) from a caller holding the gateway key, or
  on a gateway that serves only loopback clients (no key configured): the app acts for its tenant.

Then, for a call of tenant ``acme`` (:meth:`GatewayTenants.acquire`):

* the alias ``policy`` resolves to the tenant's lineage ``policy@acme`` (its live version ``policy@acme/vN``)
  and falls back to the shared ``policy`` for a tenant without one; with a :class:`TenantModels` (serving's
  :class:`~agentforge.serving.tenants.TenantAdapters`) the tenant's adapter is loaded on demand, and the call
  waits for that load;
* a model, or a rollout pin, naming another tenant's lineage (``policy@bolt/v3``) is a 404 ``model_not_found``
  exactly like a model that does not exist; a rollout of another tenant is a 404 too;
* the span records the tenant (``Span.tenant``);
* the engine's prefix cache is namespaced per tenant: every call of a tenant carries vLLM's ``cache_salt``
  (:meth:`GatewayTenants.cache_salt`: an HMAC of the tenant under a secret drawn once per gateway process), so one
  tenant cannot learn from cache-hit timing what another tenant's prompts began with (vLLM's ``cache_salt``
  documentation; the attack: "Prompt Inference Attack on Distributed LLM Inference Frameworks", 2025).

Without tenant keys and without the header nothing here runs: the gateway's path is unchanged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from agentforge.errors import NotFoundError, UserError
from agentforge.types import TENANT_HEADER, Version, check_tenant, tenant_of_name

if TYPE_CHECKING:
    from starlette.requests import Request

    from agentforge.gateway.router import ModelRouter, Upstream

__all__ = ["SCOPE_KEY", "TenantModels", "TenantRefused", "GatewayTenants"]

#: Where the key check leaves the tenant of a tenant key: ``scope["state"][SCOPE_KEY]``.
SCOPE_KEY = "agentforge.tenant"


class TenantRefused(UserError):
    """A call that names a tenant it may not act for (HTTP 403)."""


class TenantModels(Protocol):
    """Serving's side of tenants: resolves a tenant's model to a loaded version, loading it first if needed."""

    def acquire(self, tenant: str, model: str) -> tuple[str, Upstream]:
        """Resolve ``model`` for ``tenant`` and count one in-flight request on the version (pair with
        ``router.release(version)``). May block while the tenant's adapter loads (a cold start).

        Raises:
            NotFoundError: nothing serves ``model`` for this tenant.
        """
        ...

    def acquire_cached(self, tenant: str, model: str) -> tuple[str, Upstream] | None:
        """:meth:`acquire` if it can be done at once (nothing to read or load; never blocks), else ``None``."""
        ...

    def serves_own(self, tenant: str, model: str) -> bool:
        """Whether ``tenant``'s unpinned calls for ``model`` are served a version of the tenant's own lineage (not
        the shared one); then the shared alias's traffic canary never takes its rollouts."""
        ...


class GatewayTenants:
    """The tenant rules of one gateway (see the module docstring).

    Args:
        router: the gateway's router.
        models: serving's loader of tenant adapters; ``None``: a tenant's lineage is served if the router already
            has its alias ``policy@<tenant>`` (else the shared alias).
        trust_header: take ``X-Tenant`` from callers without a tenant key (the gateway key's holders, or
            loopback clients of a gateway without a key).
    """

    def __init__(self, router: ModelRouter, models: TenantModels | None, trust_header: bool = True) -> None:
        self.router, self.models, self.trust_header = router, models, trust_header
        self._salt_key = secrets.token_bytes(32)
        self._salts: dict[str, str] = {}

    def cache_salt(self, tenant: str | None) -> str | None:
        """The prefix-cache salt of ``tenant``'s calls (64 hex characters, unpredictable without this process's
        secret, the same for every call of the tenant so its own prompts still share the cache), or ``None``
        for a call with no tenant (the shared cache)."""
        if tenant is None:
            return None
        salt = self._salts.get(tenant)
        if salt is None:
            salt = self._salts[tenant] = hmac.new(self._salt_key, tenant.encode(), hashlib.sha256).hexdigest()
        return salt

    def tenant(self, request: Request) -> str | None:
        """The tenant a call acts for, or ``None``.

        Raises:
            TenantRefused: a tenant key with a header naming another tenant, or a header that is no tenant name.
        """
        keyed = (request.scope.get("state") or {}).get(SCOPE_KEY)
        header = request.headers.get(TENANT_HEADER)
        if keyed is not None:
            if header is not None and header != keyed:
                raise TenantRefused(f"this key acts for tenant {keyed!r}, not {header!r}")
            return keyed
        if header is None or not self.trust_header:
            return None
        try:
            return check_tenant(header)
        except UserError as exc:
            raise TenantRefused(f"{TENANT_HEADER}: {exc}") from None

    @staticmethod
    def visible(tenant: str | None, model: str) -> bool:
        """Whether a call of ``tenant`` may name ``model`` (shared, or its own lineage's)."""
        owner = tenant_of_name(model)
        return owner is None or owner == tenant

    def target(self, tenant: str, model: str) -> str:
        """What ``model`` means for ``tenant`` without a :class:`TenantModels`: the tenant's lineage alias when
        the router knows it, else ``model``."""
        if "@" in model:
            return model
        lineage = Version.lineage(model, tenant)
        return lineage if self.router.alias(lineage) is not None else model

    async def acquire(self, tenant: str | None, model: str) -> tuple[str, Any]:
        """Resolve ``model`` for a call of ``tenant`` and count it in flight (see the module docstring).

        Raises:
            NotFoundError: ``model`` names another tenant's lineage, or nothing serves it.
        """
        if not self.visible(tenant, model):
            raise NotFoundError(f"model {model!r} does not exist")
        try:
            return await self._acquire(tenant, model)
        except NotFoundError:  # the router's message lists every name it serves: a tenant sees only its own
            if tenant is None:
                raise
            names = [m for m in self.router.models() if self.visible(tenant, m)]
            raise NotFoundError(
                f"model {model!r} does not exist; available: {', '.join(names) or 'none'}"
            ) from None

    async def _acquire(self, tenant: str | None, model: str) -> tuple[str, Any]:
        owner = tenant or tenant_of_name(model)
        if owner is None:
            return self.router.acquire(model)
        if self.models is not None:  # warm: on the event loop; cold (a store read or a load): in a thread
            lease = self.models.acquire_cached(owner, model)
            return (
                lease
                if lease is not None
                else await anyio.to_thread.run_sync(self.models.acquire, owner, model)
            )
        return self.router.acquire(self.target(owner, model))
