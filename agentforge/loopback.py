"""The bind rule of every agentforge server: loopback by default, any other interface only with a key.

A server wrapper checks the rule before it binds (:func:`check_bind`); an app that may be run by someone
else's ASGI server (``uvicorn agentforge...:app --host 0.0.0.0``) checks it again on every request with
:class:`LoopbackGuard`, from the address the request arrived on (ASGI's ``scope["server"]``), so the rule
holds wherever the app is served, not only in agentforge's own wrappers. A Unix socket (no address) counts
as local, and so does a host *name* there: network servers (uvicorn, hypercorn) put the socket's own IP
address in ``scope["server"]``, while in-process transports (httpx's ``ASGITransport``, Starlette's
``TestClient``) put the URL's host name, and no socket is open to anyone.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import socket
from typing import TYPE_CHECKING

from agentforge.errors import UserError

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "MIN_KEY_LENGTH",
    "is_loopback",
    "check_bind",
    "free_port",
    "check_key",
    "bearer_token",
    "browser_problem",
    "LoopbackGuard",
]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free now (the OS picks it; another process may still take it before
    the caller binds it). IPv6 hosts (with a ``:``) get an IPv6 socket."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


#: The shortest API key a server accepts (a key an attacker can guess is no key).
MIN_KEY_LENGTH = 16


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``127.0.0.0/8``, ``::1`` or ``localhost``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header value (the scheme is case-insensitive,
    RFC 9110 §11.1), stripped; ``""`` for no header, another scheme (``Basic ...``) or a bare value."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def check_key(key: str | None, what: str) -> None:
    """Refuse an API key shorter than :data:`MIN_KEY_LENGTH` characters (``None``: no key, allowed).

    Raises:
        UserError: the key is too short or only whitespace.
    """
    if key is not None and len(key.strip()) < MIN_KEY_LENGTH:
        raise UserError(
            f"the {what} API key must be at least {MIN_KEY_LENGTH} characters (got {len(key)}); "
            "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )


def check_bind(host: str, key: str | None, what: str) -> None:
    """The rule before binding: a non-loopback ``host`` needs a key; any key must be long enough.

    Args:
        host: the interface to bind (``127.0.0.1``, ``0.0.0.0``, ``::``, a name).
        key: the API key clients will send, or ``None``.
        what: the server's name for the message (``"gateway"``, ``"store"``).

    Raises:
        UserError: non-loopback without a key, or a key shorter than :data:`MIN_KEY_LENGTH`.
    """
    check_key(key, what)
    if not is_loopback(host) and not key:
        raise UserError(
            f"refusing to bind the {what} to non-loopback interface {host!r} without an API key; "
            "pass an API key (clients then send 'Authorization: Bearer <key>') or bind 127.0.0.1"
        )


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=64)
def _serves(interface: str) -> bool:
    """Whether a request that arrived on ``interface`` (the server's own address) may be served without a
    key: a loopback address, or a name that is no IP address (a Unix socket path). Cached: a server has
    a handful of interfaces, and parsing one on every request showed in the gateway's profile."""
    return not _is_ip(interface) or is_loopback(interface)


@functools.lru_cache(maxsize=256)
def _local_authority(value: bytes) -> bool:
    """Whether a ``Host`` value (``127.0.0.1:8000``, ``[::1]:80``, ``localhost``) names a loopback host."""
    host = value.decode("latin-1").strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return is_loopback(host)


@functools.lru_cache(maxsize=256)
def _local_origin(value: bytes) -> bool:
    """Whether an ``Origin`` value (``http://127.0.0.1:8000``) is a page served from a loopback host."""
    scheme, sep, rest = value.decode("latin-1").strip().partition("://")
    return (
        bool(sep) and scheme.lower() in ("http", "https") and _local_authority(rest.split("/", 1)[0].encode())
    )


def browser_problem(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why a request to a keyless loopback server may come from a web page the user merely visited, or
    ``None``.

    Any page can make a browser send a ``text/plain`` POST to ``127.0.0.1`` (no CORS preflight), and DNS
    rebinding lets a page read answers under its own host name. So a keyless server refuses a ``Host`` that
    is no loopback name (rebinding), an ``Origin`` of a page not served from loopback, and a request the
    browser marks ``Sec-Fetch-Site: cross-site``. Clients that are programs (SDKs, curl) send a loopback
    ``Host`` and no ``Origin``; the dashboard's own page has a loopback origin.
    """
    for name, value in headers:
        if name == b"host" and not _local_authority(value):
            return f"Host {value.decode('latin-1')[:100]!r} is not a loopback name (DNS rebinding)"
        if name == b"origin" and not _local_origin(value):
            return f"a page from {value.decode('latin-1')[:100]!r} (cross-site request)"
        if name == b"sec-fetch-site" and value.strip().lower() == b"cross-site":
            return "a cross-site request (Sec-Fetch-Site: cross-site)"
    return None


class LoopbackGuard:
    """ASGI middleware for an app without a key: a request that arrived on a non-loopback interface gets
    a 403 with a JSON error body and never reaches the app; so does one a web page made the browser send
    (:func:`browser_problem`: a foreign ``Host`` or ``Origin``), on a real loopback socket.

    Args:
        app: the app to guard.
        what: the server's name for the message.
    """

    def __init__(self, app: ASGIApp, what: str) -> None:
        self.app, self._what = app, what

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server") if scope["type"] in ("http", "websocket") else None
        if server is None:
            await self.app(scope, receive, send)
            return
        interface = str(server[0])
        if _serves(interface):
            problem = browser_problem(scope.get("headers") or []) if _is_ip(interface) else None  # a socket
            if problem is None:
                await self.app(scope, receive, send)
                return
            code = "cross_site_request"
            message = (
                f"this agentforge {self._what} has no API key, so it serves only programs on this machine; "
                f"refused {problem}. Start it with an API key to serve browsers of other sites"
            )
        else:
            code = "non_loopback_without_key"
            message = (
                f"this agentforge {self._what} has no API key, so it only serves requests on a loopback "
                f"interface; this one arrived on {server[0]}. Start it with an API key to serve other interfaces"
            )
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(
            {"error": {"message": message, "type": "permission_error", "param": None, "code": code}}
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 403, "headers": headers})
        await send({"type": "http.response.body", "body": body})
