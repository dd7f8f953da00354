"""Request bodies with a ceiling, for every agentforge server.

A server that reads whatever a client sends lets one request fill its memory and its trace store. The
gateway reads an LLM call's body itself (:mod:`agentforge.gateway.fastpath`, 4 MiB by default); the store
API puts :class:`BodyLimit` in front of its app (16 MiB by default). Both use :func:`read_body`, which refuses
from ``Content-Length`` before reading and, for a chunked body, as soon as the bytes read pass the limit, so a
refused body is never held whole.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["API_MAX_BODY_BYTES", "BodyLimit", "read_body", "replay_body"]

logger = logging.getLogger("agentforge.bodylimit")

#: The largest request body the store API takes by default (bytes; the gateway's LLM routes have their own 4 MiB):
#: room for a span of a long-context call (a 32k-token prompt's ids, text and logprobs are under 1 MiB), far
#: below what would let one client fill the store.
API_MAX_BODY_BYTES = 16 * 1024 * 1024


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or ``None`` once it is known to exceed ``limit`` bytes (from
    ``Content-Length`` before reading, else while reading). A client that leaves mid-body gives the bytes
    read so far (the handler then answers a truncated body with a 400)."""
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            with contextlib.suppress(ValueError):
                if int(value) > limit:
                    return None
            break
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the already-read body once, then the connection's own messages."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def store_error(limit: int) -> dict[str, Any]:
    """The store API's error shape (``{"detail": {"error", "message"}}``, what :class:`HTTPStore` parses)."""
    message = f"request body is larger than this server's limit of {limit} bytes"
    return {"detail": {"error": "UserError", "message": message}}


class BodyLimit:
    """ASGI middleware: an HTTP request whose body is over ``limit`` bytes gets a 413 with a JSON error and
    never reaches the app; others reach it with their body read once and replayed.

    Args:
        app: the app to guard.
        limit: the largest body taken, in bytes (> 0); ``None``: :data:`API_MAX_BODY_BYTES` as it is now.
        error: the JSON body of the 413 for a given limit (default: the store API's shape).

    Raises:
        ValueError: ``limit`` is not positive.
    """

    def __init__(
        self, app: ASGIApp, limit: int | None = None, error: Callable[[int], dict[str, Any]] = store_error
    ) -> None:
        limit = API_MAX_BODY_BYTES if limit is None else limit
        if limit <= 0:
            raise ValueError(f"body limit must be a positive number of bytes, got {limit}")
        self.app, self._limit, self._error = app, limit, error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        body = await read_body(scope, receive, self._limit)
        if body is None:
            logger.warning("refused a request body over %d bytes on %s", self._limit, scope.get("path"))
            payload = json.dumps(self._error(self._limit)).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ]
            await send({"type": "http.response.start", "status": 413, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
            return
        await self.app(scope, replay_body(body, receive), send)
