"""The store server's admin routes: publishing and activating resource versions (what serving follows).

``POST /api/resources`` (publish) and ``POST /api/resources/activate`` (activate; a rollback is either one)
choose the weights and prompts that ``agentforge serve --follow`` and the agents pick up, so they need the
**admin key**, never the store key (:mod:`agentforge.stores.auth`):

* no key or a wrong key → 401; the store key → 403; a server started without an admin key → 403 on both;
* an adapter path (``payload["path"]`` of any resource, since serving loads whatever the active version
  names) must resolve, after following every symlink (``os.path.realpath``), to a directory holding
  ``adapter_config.json`` strictly inside the server's ``adapter_root``. ``../../etc``, an absolute path
  elsewhere, a symlink in the root pointing out of it and a hub id such as ``someorg/evil-adapter``
  (looked up as a directory under the root, never on a hub: nothing here opens a network connection) are
  400s. The stored payload holds the resolved path, so serving loads what was checked;
* activating a version re-checks its path the same way (a record written around this server is not
  trusted either);
* every admin request is logged on ``agentforge.stores.admin`` with the action, its target, the caller
  (client address and which key it presented) and the outcome: INFO when done, WARNING when refused.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Body, Header, HTTPException, Request
from fastapi.responses import Response

from agentforge.errors import UserError
from agentforge.ports import TraceStore
from agentforge.stores.auth import key_matches, presented_key
from agentforge.types import ResourceVersion

__all__ = ["admin_router", "resolve_adapter_path", "checked_payload"]

logger = logging.getLogger("agentforge.stores.admin")


def resolve_adapter_path(raw: Any, adapter_root: Path | None) -> Path:
    """The real path of an adapter directory, checked to lie inside ``adapter_root``.

    Args:
        raw: the path as sent; relative paths are taken relative to ``adapter_root``.
        adapter_root: the only directory adapters may be published from, or ``None`` (none may).

    Returns:
        The resolved absolute path (every symlink followed).

    Raises:
        UserError: no adapter root is configured; ``raw`` is not a non-empty string; it resolves outside
            the root (or to the root itself); or it is not a directory with ``adapter_config.json``.
    """
    if adapter_root is None:
        raise UserError(
            "this store server publishes no adapters: start it with adapter_root=<directory the trainers save "
            "adapters under> (create_store_app(..., adapter_root=...))"
        )
    if not isinstance(raw, str) or not raw.strip() or "\x00" in raw:
        raise UserError(f"adapter path must be a non-empty string without NUL, got {raw!r}")
    root = Path(os.path.realpath(adapter_root))
    candidate = Path(raw) if Path(raw).is_absolute() else root / raw
    real = Path(os.path.realpath(candidate))
    if real == root or not real.is_relative_to(root):
        raise UserError(
            f"adapter path {raw!r} resolves to {str(real)!r}, outside the adapter root {str(root)!r}"
        )
    if not real.is_dir() or not (real / "adapter_config.json").is_file():
        raise UserError(
            f"adapter path {raw!r} ({str(real)!r}) is not an adapter directory with adapter_config.json; "
            "hub ids are never downloaded, save the adapter under the adapter root"
        )
    return real


def checked_payload(resource: ResourceVersion, adapter_root: Path | None) -> dict[str, Any]:
    """``resource.payload`` with its adapter path resolved by :func:`resolve_adapter_path`.

    Returns:
        The payload to store: unchanged for a resource that is no adapter (e.g. ``privacy:exports``, whose
        ``path`` is an exported file) or an adapter that names no path, else with ``path`` replaced by the real
        path.

    Raises:
        UserError: a bad path, or an ``adapter`` resource naming neither a ``path`` nor ``base: true``.
    """
    payload = dict(resource.payload)
    if resource.kind != "adapter":  # serving loads adapters only (follow.py); other paths name no weights
        return payload
    if "path" in payload:
        payload["path"] = str(resolve_adapter_path(payload["path"], adapter_root))
    elif payload.get("base") is not True:
        raise UserError(
            f"adapter resource {resource.name!r} needs payload.path (or base: true for the base model)"
        )
    return payload


def _caller(request: Request, key: str | None, api_key: str | None, admin_key: str | None) -> str:
    client = request.client
    where = f"{client.host}:{client.port}" if client else "unknown client"
    if key is None:
        which = "no key"
    elif admin_key is not None and key_matches(key, admin_key):
        which = "the admin key"
    elif api_key is not None and key_matches(key, api_key):
        which = "the store key"
    else:
        which = "a wrong key"
    return f"{where} with {which}"


def _refuse(status: int, message: str) -> HTTPException:
    return HTTPException(status, detail={"error": "UserError", "message": message})


def admin_router(
    store: TraceStore,
    *,
    api_key: str | None,
    admin_key: str | None,
    adapter_root: Path | None,
    call: Callable[..., Response],
) -> APIRouter:
    """The two admin routes (see the module docstring), to include under ``/api``.

    Args:
        store: the store the resources live in.
        api_key: the store key (only to tell the caller it presented the wrong authority).
        admin_key: the admin key; ``None`` closes both routes (403).
        adapter_root: where adapters may be published from; ``None``: no adapter paths at all.
        call: the server's ``_checked``: runs a store method and maps its errors to the wire format.

    Returns:
        A router with ``POST /resources`` and ``POST /resources/activate``.
    """
    r = APIRouter()

    def authorise(
        request: Request, action: str, target: str, authorization: str | None, x_api_key: str | None
    ) -> str:
        key = presented_key(authorization, x_api_key)
        caller = _caller(request, key, api_key, admin_key)
        refusal: HTTPException | None = None
        if admin_key is None:
            refusal = _refuse(
                403, "admin routes are closed on this store server (it was started without an admin key)"
            )
        elif key is None:
            refusal = _refuse(401, f"{action} needs the admin key (Authorization: Bearer <admin key>)")
        elif api_key is not None and key_matches(key, api_key):
            refusal = _refuse(403, f"the store key cannot {action}; this route needs the admin key")
        elif not key_matches(key, admin_key):
            refusal = _refuse(401, "wrong admin key")
        if refusal is not None:
            logger.warning("admin %s %s by %s: refused %d", action, target, caller, refusal.status_code)
            raise refusal
        return caller

    def run(caller: str, action: str, target: str, fn: Callable[[], ResourceVersion]) -> Response:
        try:
            response = call(fn)
        except HTTPException as exc:
            message = exc.detail.get("message") if isinstance(exc.detail, dict) else exc.detail
            logger.warning(
                "admin %s %s by %s: failed %d: %s", action, target, caller, exc.status_code, message
            )
            raise
        logger.info("admin %s %s by %s: done", action, target, caller)
        return response

    @r.post("/resources")
    def publish(
        request: Request,
        resource: ResourceVersion,
        activate: bool = True,
        authorization: str | None = Header(default=None),
        x_api_key: str | None = Header(default=None),
    ) -> Response:
        target = f"{resource.name!r} ({resource.kind}, activate={activate})"
        caller = authorise(request, "publish resources", target, authorization, x_api_key)

        def fn() -> ResourceVersion:
            payload = checked_payload(resource, adapter_root)
            return store.publish_resource(resource.model_copy(update={"payload": payload}), activate)

        return run(caller, "publish", target, fn)

    @r.post("/resources/activate")
    def activate(
        request: Request,
        name: str = Body(),
        version: int = Body(),
        authorization: str | None = Header(default=None),
        x_api_key: str | None = Header(default=None),
    ) -> Response:
        target = f"{name!r} v{version}"
        caller = authorise(request, "activate resources", target, authorization, x_api_key)

        def fn() -> ResourceVersion:
            checked_payload(store.get_resource(name, version), adapter_root)
            return store.activate_resource(name, version)

        return run(caller, "activate", target, fn)

    return r
