"""The gateway's hot path: LLM calls go straight from the ASGI server to the handler.

Every LLM call of every agent crosses the gateway, so its two routes (``POST /v1/chat/completions`` and
``POST /v1/completions``, also under ``/rollouts/{rollout_id}``) skip FastAPI's router, dependency
solver and exception middleware: :class:`FastPathMiddleware` matches the path itself and hands a plain
Starlette ``Request`` to the same handler the FastAPI routes use (they stay registered, so OpenAPI-style
introspection, ``app.routes`` and every other route work as before). :class:`GatewayApp` puts it, and
the API key check before it, in front of FastAPI's own middleware stack (error pages, body limits,
telemetry), which the LLM routes do not need. A handler error becomes an OpenAI-style 500.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentforge.gateway.wire import Endpoint, error_body
from agentforge.types import ROLLOUT_PATH_PREFIX

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["FastPathMiddleware", "GatewayApp", "match_llm_route"]

logger = logging.getLogger("agentforge.gateway")

_SUFFIXES: tuple[tuple[str, Endpoint], ...] = (
    ("/v1/chat/completions", "chat"),
    ("/v1/completions", "completions"),
)
_PREFIX = ROLLOUT_PATH_PREFIX


def match_llm_route(path: str) -> tuple[Endpoint, str | None] | None:
    """``(endpoint, rollout_id)`` when ``path`` is one of the LLM routes, else ``None``.

    ``/v1/chat/completions`` → ``("chat", None)``; ``/rollouts/ro-1/v1/completions`` →
    ``("completions", "ro-1")``. A rollout id is one non-empty path segment, as in the router's
    ``{rollout_id}``.
    """
    for suffix, endpoint in _SUFFIXES:
        if path == suffix:
            return endpoint, None
        if path.startswith(_PREFIX) and path.endswith(suffix):
            rollout_id = path[len(_PREFIX) : -len(suffix)]
            if rollout_id and "/" not in rollout_id:
                return endpoint, rollout_id
    return None


class FastPathMiddleware:
    """ASGI middleware serving the LLM routes with ``handle(request, endpoint)`` (see the module docstring).

    Args:
        app: the rest of the application.
        handle: the gateway's handler; ``request.path_params["rollout_id"]`` is set for rollout routes.
    """

    def __init__(self, app: ASGIApp, handle: Callable[[Request, Endpoint], Awaitable[Response]]) -> None:
        self.app, self._handle = app, handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        root = scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root) :]
        route = match_llm_route(path)
        if route is None:
            await self.app(scope, receive, send)
            return
        endpoint, rollout_id = route
        scope["path_params"] = {} if rollout_id is None else {"rollout_id": rollout_id}
        request = Request(scope, receive)
        try:
            response = await self._handle(request, endpoint)
        except Exception as exc:  # never a bare 500 page: the client gets OpenAI's error shape
            logger.exception("gateway handler failed on %s", path)
            response = _internal_error(exc)
        await response(scope, receive, send)


class GatewayApp(FastAPI):
    """The gateway's FastAPI app with the LLM routes served in front of FastAPI's stack.

    Call :meth:`serve_llm_routes` once after creating it; until then it is a plain FastAPI app.
    """

    _entry: Any = None

    def serve_llm_routes(
        self, handle: Callable[[Request, Endpoint], Awaitable[Response]], api_key: str | None
    ) -> None:
        """Route LLM calls to ``handle``; with ``api_key``, every request is checked first (see
        :class:`~agentforge.gateway.auth.ApiKeyMiddleware`), whichever route serves it."""
        from agentforge.gateway.auth import ApiKeyMiddleware

        entry: Any = FastPathMiddleware(super().__call__, handle)
        self._entry = ApiKeyMiddleware(entry, api_key) if api_key else entry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._entry is None:
            await super().__call__(scope, receive, send)
        else:
            await self._entry(scope, receive, send)


def _internal_error(exc: Exception) -> Response:
    body: dict[str, Any] = error_body(
        f"internal gateway error: {type(exc).__name__}", "internal_error", "internal_error"
    )
    return JSONResponse(body, status_code=500)
