"""API-key check for the gateway's OpenAI routes (the store's ``/api`` routes check the key themselves)."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

import anyio
from fastapi.responses import JSONResponse

from agentforge.gateway.tenancy import SCOPE_KEY
from agentforge.gateway.wire import error_body
from agentforge.loopback import bearer_token

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from agentforge.ports import TenantDirectory

__all__ = ["ApiKeyMiddleware"]


class ApiKeyMiddleware:
    """Reject requests without ``Authorization: Bearer <api_key>`` (or ``X-Api-Key``) with a 401; paths under
    ``open_prefixes`` (apps mounted there that check the same key themselves) pass."""

    def __init__(self, app: ASGIApp, api_key: str, open_prefixes: tuple[str, ...] = ()) -> None:
        self.app, self._key = app, api_key.encode()
        #: tenant keys taken in place of the gateway key (their tenant goes to ``scope["state"][SCOPE_KEY]``)
        self.tenants: TenantDirectory | None = None
        # apps mounted under these prefixes check the key themselves (the dashboard takes it from a cookie)
        self._open = tuple(p.rstrip("/") + "/" for p in open_prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, root = scope.get("path", ""), scope.get("root_path") or ""
        if root and path.startswith(root):  # mounted in a parent app: judge the path inside the gateway
            path = path[len(root) :]
        mounted = bool(self._open) and (path + "/").startswith(self._open)
        if scope["type"] == "http" and path != "/health" and not path.startswith("/api/") and not mounted:
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"x-api-key") or bearer_token(
                headers.get(b"authorization", b"").decode("latin-1")
            ).encode("latin-1")
            if not hmac.compare_digest(given, self._key) and not await self._tenant_key(scope, given):
                body = error_body(
                    "missing or wrong API key for the agentforge gateway",
                    "invalid_request_error",
                    "invalid_api_key",
                )
                await JSONResponse(body, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _tenant_key(self, scope: Scope, given: bytes) -> bool:
        """Whether ``given`` is a tenant key; if so its tenant goes into the scope (the lookup may read the
        store, so it runs in a worker thread)."""
        if self.tenants is None or not given:
            return False
        key = given.decode("latin-1")
        peek = getattr(self.tenants, "peek", None)  # a TenantKeyCache answers a fresh key at once
        known = peek(key) if peek is not None else None
        if known is None:  # a store read: in a worker thread
            known = (await anyio.to_thread.run_sync(self.tenants.tenant_of_key, key),)
        tenant = known[0]
        if tenant is None:
            return False
        scope.setdefault("state", {})[SCOPE_KEY] = tenant
        return True
