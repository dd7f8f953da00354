"""Run an ASGI app (the gateway, or a fake upstream) under uvicorn in a background thread.

Binding rule: the gateway listens on loopback (``127.0.0.1``) by default; binding any other interface
(``0.0.0.0``, a LAN address, a host name) without an ``api_key`` raises :class:`~agentforge.errors.UserError`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import uvicorn

from agentforge.config import HTTP_KEEP_ALIVE_S, HTTP_REQUEST_READ_S
from agentforge.errors import ServingError
from agentforge.gateway.fastpath import CLIENT_GONE, DISCONNECT_HOOK
from agentforge.loopback import check_bind, is_loopback
from agentforge.types import rollout_base_url

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from agentforge.gateway.router import ModelRouter
    from agentforge.ports import TraceStore

__all__ = [
    "is_loopback",
    "AppServer",
    "GatewayServer",
    "HeadWithBody",
    "serve_gateway",
    "DISCONNECT_HOOK",
    "bind_socket",
    "check_port",
]


class HeadWithBody:
    """A transport proxy that sends a response's head together with the first bytes written after it.

    uvicorn writes a response's head as soon as the app starts the response and its body separately, so
    every answer cost the server two ``send`` system calls, and on loopback each one also runs the peer's
    TCP receive path on this thread. A write that is a whole response head (starts with ``HTTP/``, ends with
    the blank line) is held and goes out with the next write; if none comes in this turn of the event loop,
    it goes out alone at the next (``call_soon``), and ``close`` sends it first. Order is kept either way.
    Everything else is the wrapped transport's.

    Args:
        transport: the connection's transport.
        loop: the connection's event loop.
    """

    __slots__ = ("_transport", "_held", "_loop")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        """Write ``data`` (a response head: hold it for the next write)."""
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data[:5] == b"HTTP/" and data[-4:] == b"\r\n\r\n":
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Send a held head now."""
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

    def close(self) -> None:
        """Send a held head, then close the transport."""
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _http_protocol(read_timeout_s: float = HTTP_REQUEST_READ_S) -> Any:
    """uvicorn's ``httptools`` protocol whose transport is a :class:`HeadWithBody`, whose requests carry
    :data:`DISCONNECT_HOOK` and which closes slow connections, or ``"auto"`` (uvicorn's choice) when
    ``httptools`` is not installed.

    Slow connections: uvicorn itself waits for ever for the rest of a request once its first byte came (and for
    the first byte of a connection's first request). Here a request must arrive whole within ``read_timeout_s``
    seconds of its first byte (head and body; the app then sees ``http.disconnect``), and a new connection must
    send its first byte within the keep-alive time, as an idle kept-alive one must."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "auto"

    class HeadWithBodyProtocol(HttpToolsProtocol):
        _read_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(HeadWithBody(transport, self.loop))  # type: ignore[arg-type]
            # the keep-alive timer, which uvicorn arms only after a response: any byte received cancels it
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._stop_read_timer()
            self._read_timer = self.loop.call_later(read_timeout_s, self._read_too_slow)

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self.scope[DISCONNECT_HOOK] = None  # type: ignore[literal-required]

        def on_message_complete(self) -> None:
            self._stop_read_timer()
            super().on_message_complete()

        def _stop_read_timer(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _read_too_slow(self) -> None:
            self._read_timer = None
            if not self.transport.is_closing():
                self.logger.info(
                    "closed a connection whose request took over %.0f s to arrive", read_timeout_s
                )
                self.transport.close()  # the app, if the head came, sees http.disconnect (connection_lost)

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_read_timer()
            cycle = self.cycle
            hook = None
            if cycle is not None and not cycle.response_complete:
                hook = cycle.scope.get(DISCONNECT_HOOK)
                if hook is None and DISCONNECT_HOOK in cycle.scope:  # no watch yet: leave word for it
                    cycle.scope[DISCONNECT_HOOK] = CLIENT_GONE
            super().connection_lost(exc)
            if hook:  # a watch's callable (not None, not CLIENT_GONE)
                hook()

    return HeadWithBodyProtocol


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``SO_REUSEADDR``, as uvicorn binds; not listening yet).

    Raises:
        ServingError: the address cannot be bound (the port is taken, the host is not this machine's).
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise ServingError(f"cannot bind {host}:{port}: {exc}") from exc
    return sock


def check_port(host: str, port: int) -> None:
    """Fail now, not after a slow start, when ``host:port`` cannot be bound (see :func:`bind_socket`); the
    port is free again on return (another process may still take it before the server binds it).

    Raises:
        ServingError: as :func:`bind_socket`.
    """
    bind_socket(host, port).close()


class AppServer:
    """An ASGI app served by uvicorn in a daemon thread; ``port=0`` picks a free port.

    Args:
        app: the ASGI app.
        host: interface to bind.
        port: TCP port (0: any free port; read :attr:`port` after :meth:`start`).
        startup_timeout_s: seconds to wait for the server to accept connections.
        read_timeout_s: seconds a request may take to arrive, from its first byte to its last (slow clients
            are disconnected; ``None``: :data:`~agentforge.config.HTTP_REQUEST_READ_S`, read at :meth:`start`).
    """

    def __init__(
        self,
        app: ASGIApp,
        host: str = "127.0.0.1",
        port: int = 0,
        startup_timeout_s: float = 10.0,
        read_timeout_s: float | None = None,
    ) -> None:
        self.app, self.host, self.port = app, host, port
        self._startup_timeout_s, self.read_timeout_s = startup_timeout_s, read_timeout_s
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` (IPv6 hosts bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> Self:
        """Bind, start serving and wait until ready.

        Returns:
            ``self``.

        Raises:
            ServingError: the port is taken or the server did not start within the timeout.
        """
        if self._thread is not None:
            return self
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(  # no X-Forwarded-* rewriting: these servers are not behind a proxy
            self.app,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=5,
            proxy_headers=False,
            http=_http_protocol(HTTP_REQUEST_READ_S if self.read_timeout_s is None else self.read_timeout_s),
            timeout_keep_alive=HTTP_KEEP_ALIVE_S,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"uvicorn-{self.port}"
        )
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServingError(f"server on {self.url} did not start within {self._startup_timeout_s} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit and join its thread (waits at most ``timeout_s`` seconds). Safe twice."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._server, self._thread = None, None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class GatewayServer(AppServer):
    """The gateway app on a port, in a background thread.

    Args:
        store: trace store for spans.
        router: model router.
        host: interface; non-loopback needs ``api_key``.
        port: TCP port (0: any free port).
        api_key: required from clients when set.
        **gateway_kwargs: passed to :func:`~agentforge.gateway.app.create_gateway`
            (``transport``, ``timeout_s``, ``include_store_api``).

    Attributes:
        store: the trace store spans are written to.
        router: the model router.

    Raises:
        UserError: ``host`` is not loopback and no ``api_key`` is given, or the key is shorter than
            :data:`~agentforge.loopback.MIN_KEY_LENGTH`.
    """

    def __init__(
        self,
        store: TraceStore,
        router: ModelRouter,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        **gateway_kwargs: Any,
    ) -> None:
        check_bind(host, api_key, "gateway")
        from agentforge.gateway.app import create_gateway

        self.store, self.router = store, router
        super().__init__(create_gateway(store, router, api_key, **gateway_kwargs), host, port)

    @property
    def openai_base_url(self) -> str:
        """Base URL for OpenAI clients without attribution: ``http://host:port/v1``."""
        return f"{self.url}/v1"

    def rollout_base_url(self, rollout_id: str) -> str:
        """Base URL that attributes every call to ``rollout_id``: ``http://host:port/rollouts/<id>/v1``."""
        return rollout_base_url(self.url, rollout_id)

    def wait_privacy_ready(self) -> None:
        """Block until the privacy policy's detectors are built (they build in a background thread; calls that
        arrive first wait for them). At once when privacy is off.

        Raises:
            MissingExtraError: a detection library failed to import.
        """
        privacy = self.app.state.gateway.privacy
        if privacy is not None:
            privacy.detector  # noqa: B018 - the property waits for the build


def serve_gateway(
    store: TraceStore,
    router: ModelRouter,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    **gateway_kwargs: Any,
) -> GatewayServer:
    """Start a :class:`GatewayServer` and return it (call ``stop()`` or use it as a context manager).

    Raises:
        UserError: non-loopback ``host`` without ``api_key``.
        ServingError: the port cannot be bound or the server did not start.
    """
    return GatewayServer(store, router, host, port, api_key, **gateway_kwargs).start()
