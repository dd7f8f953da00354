"""The gateway's hot path: LLM calls go straight from the ASGI server to the handler.

Every LLM call of every agent crosses the gateway, so its two routes (``POST /v1/chat/completions`` and
``POST /v1/completions``, also under ``/rollouts/{rollout_id}``) skip FastAPI's router, dependency
solver and exception middleware: :class:`FastPathMiddleware` matches the path itself and hands a plain
Starlette ``Request`` to the same handler the FastAPI routes use (they stay registered, so OpenAPI-style
introspection, ``app.routes`` and every other route work as before). :class:`GatewayApp` puts it, and
the API key check before it, in front of FastAPI's own middleware stack (error pages, body limits,
telemetry), which the LLM routes do not need. A handler error becomes an OpenAI-style 500.

On the LLM routes the middleware also reads the body itself, refusing one over ``max_request_bytes`` with a
413 before anything is forwarded or stored, and watches the connection while the handler waits for the
engine: a client that leaves cancels its call (the upstream request is closed, the version's in-flight
count released, the span recorded with ``client_disconnected``), so clients that give up on a hung engine
never pile up on the connection pool and starve the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentforge.bodylimit import read_body, replay_body
from agentforge.gateway.wire import Endpoint, error_body
from agentforge.loopback import LoopbackGuard
from agentforge.types import ROLLOUT_PATH_PREFIX

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "FastPathMiddleware",
    "GatewayApp",
    "LLMRoute",
    "match_llm_route",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DISCONNECT_HOOK",
    "CLIENT_GONE",
]

#: A scope key that :class:`~agentforge.gateway.server.AppServer`'s HTTP protocol sets to ``None`` on every
#: request: an app may put a callable there, which the protocol calls (on the event loop's thread) when the client's connection is lost
#: before the response of the request the connection is serving is complete (uvicorn's current cycle: a
#: request pipelined behind another is not told, just as uvicorn's own ``http.disconnect`` does not reach it).
#: The gateway's fast path uses it instead of a task per call that waits on ``receive()`` for
#: ``http.disconnect`` (which it still uses under other ASGI servers).
DISCONNECT_HOOK = "agentforge.disconnect_hook"
#: What the protocol leaves under :data:`DISCONNECT_HOOK` when the connection was lost before the app put its
#: callable there (a client that left while its request was still being read or parsed): the app's watch then
#: cancels the call at once instead of waiting for a disconnect that has already happened.
CLIENT_GONE = False

#: The largest request body the gateway takes by default (bytes): far above any context window's worth
#: of text, far below what would let one client fill the trace store.
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024

logger = logging.getLogger("agentforge.gateway")

#: What the fast path serves: the gateway's own endpoints (:data:`~agentforge.gateway.wire.Endpoint`) and the
#: dialects over its chat handler.
LLMRoute = Endpoint | Literal["messages", "responses"]

_SUFFIXES: tuple[tuple[str, LLMRoute], ...] = (
    ("/v1/chat/completions", "chat"),
    ("/v1/completions", "completions"),
    ("/v1/messages", "messages"),  # the Anthropic dialect (gateway/anthropic.py)
    ("/v1/responses", "responses"),  # the Responses dialect (gateway/responses.py)
)
_PREFIX = ROLLOUT_PATH_PREFIX


def match_llm_route(path: str) -> tuple[LLMRoute, str | None] | None:
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
        max_request_bytes: the largest body taken; larger ones get a 413 (OpenAI error shape).
    """

    def __init__(
        self,
        app: ASGIApp,
        handle: Callable[[Request, LLMRoute], Awaitable[Response]],
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        self.app, self._handle, self._max = app, handle, max_request_bytes

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
        body = await read_body(scope, receive, self._max)
        if body is None:
            logger.warning("refused a request body over %d bytes on %s", self._max, path)
            await _too_large(self._max)(scope, receive, send)
            return
        request = Request(scope, replay_body(body, receive))
        task = asyncio.current_task()
        watch = _Watch(scope, receive, task)
        try:
            response = await self._handle(request, endpoint)
            if watch.on and getattr(response, "watch_disconnect", False):
                await response(scope, receive, watch.until_end(send))  # a stream: watched throughout
                return
        except asyncio.CancelledError:
            if not watch.client_left():
                raise  # cancelled from outside (server shutdown): not ours to swallow
            task.uncancel()  # type: ignore[union-attr]  # the client left: nothing to answer
            return
        except Exception as exc:  # never a bare 500 page: the client gets OpenAI's error shape
            logger.exception("gateway handler failed on %s", path)
            response = _internal_error(exc)
        finally:
            watch.stop()
        await response(scope, receive, send)


class _Watch:
    """Cancels the call's task when its client leaves: through the server's :data:`DISCONNECT_HOOK` where
    it offers one (no task per call), else with a task that waits on ``receive()`` for ``http.disconnect``."""

    __slots__ = ("_scope", "_task", "_watcher", "_left", "on")

    def __init__(self, scope: Scope, receive: Receive, task: asyncio.Task[Any] | None) -> None:
        self._scope, self._task, self._left = scope, task, False
        self._watcher: asyncio.Future[bool] | None = None
        self.on = task is not None
        if task is None:
            return
        if DISCONNECT_HOOK in scope:
            if scope[DISCONNECT_HOOK] is CLIENT_GONE:  # the client left before the call began
                self._client_left()
                return
            scope[DISCONNECT_HOOK] = self._client_left
        else:
            self._watcher = asyncio.ensure_future(_cancel_on_disconnect(receive, task))

    def _client_left(self) -> None:
        if self.on:
            self._left = True
            self.stop()
            self._task.cancel()  # type: ignore[union-attr]

    def client_left(self) -> bool:
        """Whether the task was cancelled because the client left."""
        watcher = self._watcher
        if watcher is not None:
            return watcher.done() and not watcher.cancelled() and watcher.result()
        return self._left

    def stop(self) -> None:
        """Stop watching (idempotent)."""
        if self.on:
            self.on = False
            if self._watcher is not None:
                if not self._watcher.done():
                    self._watcher.cancel()
            else:
                self._scope[DISCONNECT_HOOK] = None

    def until_end(self, send: Send) -> Send:
        """``send`` that stops watching before the response's last message (after it the server reports
        the connection as disconnected, which must not cancel the finishing task)."""

        async def wrapped(message: Any) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.stop()
            await send(message)

        return wrapped


async def _cancel_on_disconnect(receive: Receive, task: asyncio.Task[Any]) -> bool:
    """Wait for the client to leave, then cancel ``task``; returns whether it did."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            task.cancel()
            return True


def _too_large(limit: int) -> Response:
    body = error_body(
        f"request body is larger than this gateway's limit of {limit} bytes",
        "invalid_request_error",
        "request_too_large",
    )
    return JSONResponse(body, status_code=413)


class GatewayApp(FastAPI):
    """The gateway's FastAPI app with the LLM routes served in front of FastAPI's stack.

    Call :meth:`serve_llm_routes` once after creating it; until then it is a plain FastAPI app.
    """

    _entry: Any = None

    def serve_llm_routes(
        self,
        handle: Callable[[Request, LLMRoute], Awaitable[Response]],
        api_key: str | None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        open_prefixes: tuple[str, ...] = (),
    ) -> None:
        """Route LLM calls to ``handle``; with ``api_key``, every request is checked first (see
        :class:`~agentforge.gateway.auth.ApiKeyMiddleware`), whichever route serves it; without one, only
        requests that arrived on a loopback interface are served (:class:`~agentforge.loopback.LoopbackGuard`),
        however the app is run. Paths under ``open_prefixes`` (mounted apps that check the key themselves)
        skip the key check, not the loopback rule."""
        from agentforge.gateway.auth import ApiKeyMiddleware

        entry: Any = FastPathMiddleware(super().__call__, handle, max_request_bytes)
        self._entry = (
            ApiKeyMiddleware(entry, api_key, open_prefixes) if api_key else LoopbackGuard(entry, "gateway")
        )

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
