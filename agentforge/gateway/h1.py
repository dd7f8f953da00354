"""A lean pooled HTTP/1.1 client for the gateway's upstream calls: asyncio protocols + ``httptools``.

The gateway sends one ``POST`` per LLM call to an engine on a plain ``http://`` URL, nearly always on
loopback or a LAN. A general-purpose client does far more per request than that needs (cookie jars,
redirects, tracing hooks, URL objects, header case-folding dicts): in the gateway's profile aiohttp's
client was about a third of the gateway's CPU per call. This client writes the request head and body in
one ``write`` and parses the answer with ``httptools`` (the llhttp parser uvicorn uses), with keep-alive
connections kept per ``(host, port)``:

* a connection goes back to the pool only when its answer was read to the end and both sides keep it
  alive (``HttpResponseParser.should_keep_alive``); a stream closed early closes its connection;
* a call on a *reused* connection that breaks before any byte of the answer arrived (the engine closed
  an idle keep-alive connection at the same moment) is sent once more on a new connection: the engine
  never saw it, so this cannot run a call twice (RFC 9112 §9.3.1 lets clients retry such requests);
* timeouts: ``connect_s`` to connect, then ``read_s`` without a byte from the engine (the head, then
  between stream blocks), checked by one timer per call rather than one per read.

Errors are the gateway's own (:mod:`agentforge.gateway.upstream`): ``UpstreamTimeout``,
``UpstreamUnreachable`` (no connection, or it broke before the answer's head, or the head was not
HTTP) and, while a stream is read, ``UpstreamStreamError``. Only ``http://`` URLs are served; the
gateway uses aiohttp for anything else.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import httptools

__all__ = ["H1Client", "H1Answer", "H1Error", "H1Timeout", "H1Broken", "H1Refused"]


class H1Error(Exception):
    """Base of this client's errors; ``answered`` says whether any byte of the answer had arrived."""

    answered = False


class H1Timeout(H1Error):
    """No byte from the engine for ``read_s`` seconds (or no connection within ``connect_s``)."""


class H1Broken(H1Error):
    """The connection failed, closed, or sent something that is not HTTP/1.1."""


class H1Refused(H1Broken):
    """No connection could be opened (refused, no route): nothing of the request was sent."""


_END = object()


class _Conn(asyncio.Protocol):
    """One keep-alive connection: parses answers and hands their parts to the call in progress."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.open = False
        self.uses = 0
        self._reset()

    def _reset(self) -> None:
        self.head: asyncio.Future[int] | None = None
        self.parts: collections.deque[Any] = collections.deque()
        self.wake: asyncio.Future[None] | None = None
        self.complete = False
        self.keep_alive = False
        self.answered = False
        self.stream = False
        self.last_read = 0.0
        self.status = 0
        self.draining: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def data_received(self, data: bytes) -> None:
        self.answered = True
        self.last_read = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(H1Broken(f"the engine's answer is not valid HTTP/1.1: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if not self.complete:
            why = f"{type(exc).__name__}: {exc}" if exc else "the engine closed the connection"
            self._fail(H1Broken(why))

    # --- httptools callbacks ----------------------------------------------------------------------
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.stream and self.head is not None and not self.head.done():
            self.head.set_result(self.status)

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)
        if self.stream:
            self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # only valid inside this callback
        if self.draining is not None:  # the call already ended: the connection goes back to the pool
            self.draining.cancel()
            self.draining = None
            self.done()
            return
        if self.stream:
            self.parts.append(_END)
            self._wake()
        elif self.head is not None and not self.head.done():
            self.head.set_result(self.status)

    # --- used by H1Client -------------------------------------------------------------------------
    def _wake(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    def _fail(self, exc: H1Error) -> None:
        exc.answered = self.answered
        if self.head is not None and not self.head.done():
            self.head.set_exception(exc)
        elif self.stream:
            self.parts.append(exc)
            self._wake()

    def check_idle(self, read_s: float) -> float | None:
        """Fail the call when no byte came for ``read_s`` seconds; else the seconds left to wait."""
        if self.complete or not self.open:
            return None
        left = self.last_read + read_s - time.monotonic()
        if left > 0:
            return left
        self._fail(H1Timeout(f"no data from the engine for {read_s} s"))
        self.close()
        return None

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()

    def done(self) -> None:
        """The call is over: back to the pool when the answer was complete and keep-alive, else closed."""
        if self.open and self.complete and self.keep_alive:
            self._reset()
            self.pool.idle.append(self)
        else:
            self.close()

    def finish_in_background(self, wait_s: float) -> None:
        """The call is over but the answer's last bytes (a stream's closing chunk) are still on their way:
        the connection goes back to the pool when they arrive, or is closed after ``wait_s`` seconds."""
        if self.complete or not self.open or self.draining is not None:
            return
        self.parts.clear()
        self.draining = asyncio.get_running_loop().call_later(wait_s, self._give_up)

    def _give_up(self) -> None:
        self.draining = None
        if not self.complete:
            self.close()


class _Pool:
    """Idle keep-alive connections to one ``(host, port)``, most recently used first."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: collections.deque[_Conn] = collections.deque()
        self.host_header = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"


class _Watch:
    """One call's read timer: fires after ``read_s``, re-arms for what is left when bytes came meanwhile."""

    __slots__ = ("conn", "read_s", "handle")

    def __init__(self, conn: _Conn, read_s: float) -> None:
        self.conn, self.read_s = conn, read_s
        self.handle = asyncio.get_running_loop().call_later(read_s, self._check)

    def _check(self) -> None:
        left = self.conn.check_idle(self.read_s)
        if left is not None:
            self.handle = asyncio.get_running_loop().call_later(left, self._check)

    def cancel(self) -> None:
        self.handle.cancel()


class H1Answer:
    """An answer: ``status``, then ``body`` (non-streamed) or :meth:`blocks` (streamed), then :meth:`close`."""

    def __init__(self, client: H1Client, conn: _Conn, status: int, body: bytes | None) -> None:
        self._client, self._conn, self.status, self.body = client, conn, status, body
        self._closed = False
        self._watch: _Watch | None = None  # a stream's idle timer, armed at its first wait

    async def read(self, wrap: Callable[[H1Error], Exception] | None = None) -> bytes:
        """The next piece of the streamed body (chunked encoding already removed): everything that arrived
        since the last read, in one piece; ``b""`` at its end. An engine writes each SSE event as its own
        HTTP chunk, and one network read often holds many: handing them out together lets the relay
        answer them with one write to its client instead of one write per event.

        Args:
            wrap: turns this client's error into the caller's own (raised ``from`` it); ``None``: raised as is.

        Raises:
            H1Timeout, H1Broken: the engine went quiet for ``read_s`` or the connection broke.
        """
        conn = self._conn
        parts = conn.parts
        while True:
            if parts:
                ready: list[bytes] = []
                while parts:
                    part = parts[0]
                    if part is _END or isinstance(part, H1Error):
                        break
                    ready.append(parts.popleft())
                if ready:
                    return ready[0] if len(ready) == 1 else b"".join(ready)
                part = parts[0]  # left in place: a read after the end or a failure gives the same answer
                self._stop_watch()
                if part is _END:
                    return b""
                if wrap is None:
                    raise part
                raise wrap(part) from part
            if self._watch is None:  # one idle timer for the stream: it re-arms itself while bytes come
                self._watch = self._client._watch(conn)
            conn.wake = asyncio.get_running_loop().create_future()
            try:
                await conn.wake
            finally:
                conn.wake = None

    async def blocks(self) -> AsyncIterator[bytes]:
        """:meth:`read` as an iterator: the streamed body's pieces until its end.

        Raises:
            H1Timeout, H1Broken: as :meth:`read`.
        """
        while block := await self.read():
            yield block

    def _stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def close(self, finish_s: float = 0.0) -> None:
        """Release the connection (to the pool when the answer was read to its end). Idempotent.

        Args:
            finish_s: when the answer's end has not arrived yet, wait up to this many seconds for it in the
                background (the caller goes on at once) and then hand the connection back to the pool;
                ``0``: close it now.
        """
        if not self._closed:
            self._closed = True
            self._stop_watch()
            if finish_s > 0:
                self._conn.finish_in_background(finish_s)
            if self._conn.draining is None:
                self._conn.done()


class H1Client:
    """Pooled keep-alive HTTP/1.1 ``POST`` client for ``http://`` engines (see the module docstring).

    Args:
        read_s: seconds without a byte from the engine before :class:`H1Timeout`.
        connect_s: seconds to open a connection.
    """

    def __init__(self, read_s: float, connect_s: float = 10.0) -> None:
        self.read_s, self.connect_s = read_s, connect_s
        self._pools: dict[tuple[str, int], _Pool] = {}
        self._paths: dict[str, tuple[_Pool, bytes]] = {}

    @staticmethod
    def serves(url: str) -> bool:
        """Whether ``url`` is one this client takes (``http://`` with a host)."""
        parts = urlsplit(url)
        return parts.scheme == "http" and bool(parts.hostname)

    def _target(self, url: str) -> tuple[_Pool, bytes]:
        hit = self._paths.get(url)
        if hit is None:
            parts = urlsplit(url)
            host, port = parts.hostname or "", parts.port or 80
            pool = self._pools.get((host, port))
            if pool is None:
                pool = self._pools[(host, port)] = _Pool(host, port)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            line = f"POST {path} HTTP/1.1\r\nhost: {pool.host_header}\r\n".encode("latin-1")
            hit = self._paths[url] = (pool, line)
        return hit

    def _watch(self, conn: _Conn) -> _Watch:
        conn.last_read = time.monotonic()
        return _Watch(conn, self.read_s)

    async def _connect(self, pool: _Pool) -> _Conn:
        """A new connection, opened with Python's own ``socket.connect`` (also under uvloop, whose
        ``create_connection`` would connect in C, out of sight of socket-level policies such as the
        test suite's guard), ``TCP_NODELAY`` on: a request is one write and must leave at once."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_s):
                infos = await loop.getaddrinfo(pool.host, pool.port, type=socket.SOCK_STREAM)
                error: OSError = OSError(f"no address for {pool.host_header}")
                for family, kind, proto, _, address in infos:
                    sock = socket.socket(family, kind, proto)
                    try:
                        sock.setblocking(False)
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        await loop.sock_connect(sock, address)
                    except OSError as exc:
                        sock.close()
                        error = exc
                        continue
                    except BaseException:
                        sock.close()
                        raise
                    _, conn = await loop.create_connection(lambda: _Conn(pool), sock=sock)
                    return conn
                raise error
        except TimeoutError as exc:
            raise H1Timeout(f"no connection to {pool.host_header} within {self.connect_s} s") from exc
        except OSError as exc:
            raise H1Refused(f"{type(exc).__name__}: {exc}") from exc

    async def post(self, url: str, body: bytes, headers: dict[str, str], stream: bool) -> H1Answer:
        """Send ``POST url`` with ``body``; returns once the answer's head (streams) or whole answer arrived.

        Args:
            url: an ``http://`` URL (see :meth:`serves`).
            body: the request body, sent with ``content-length``.
            headers: extra request headers (lower-case names; no ``host`` or ``content-length``).
            stream: whether to return at the head and hand the body out through :meth:`H1Answer.blocks`.

        Raises:
            H1Timeout, H1Broken: see the module docstring; a cancelled call closes its connection.
        """
        pool, line = self._target(url)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = b"".join((line, extra.encode("latin-1"), b"content-length: %d\r\n\r\n" % len(body), body))
        while pool.idle:
            conn = pool.idle.pop()
            if conn.open:
                try:
                    return await self._send(conn, request, stream)
                except H1Broken as exc:
                    if exc.answered:
                        raise
                    # the engine closed this idle connection as we sent: it never saw the call
        return await self._send(await self._connect(pool), request, stream)

    async def _send(self, conn: _Conn, request: bytes, stream: bool) -> H1Answer:
        loop = asyncio.get_running_loop()
        conn.stream = stream
        conn.head = head = loop.create_future()
        conn.uses += 1
        assert conn.transport is not None
        conn.transport.write(request)
        timer = self._watch(conn)
        try:
            status = await head
        except BaseException:
            conn.close()  # a timeout, a break or the caller cancelled: this connection is spent
            raise
        finally:
            timer.cancel()
        if stream:
            return H1Answer(self, conn, status, None)
        body = b"".join(conn.parts) if len(conn.parts) != 1 else conn.parts[0]
        answer = H1Answer(self, conn, status, body)
        answer.close()
        return answer

    async def aclose(self) -> None:
        """Close every idle connection."""
        for pool in self._pools.values():
            while pool.idle:
                pool.idle.pop().close()
        with contextlib.suppress(Exception):
            await asyncio.sleep(0)
