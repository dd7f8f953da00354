"""The gateway's client for the engines it forwards to: one pooled keep-alive client per gateway.

Interchangeable implementations behind :func:`upstream_client`:

* **h1** (default for ``http://`` engines when ``httptools`` is installed):
  :class:`~agentforge.gateway.h1.H1Client`, a lean keep-alive HTTP/1.1 pool on asyncio protocols that
  costs a fraction of a general-purpose client's CPU per call (see that module).
* **aiohttp** (``https://`` engines, or without ``httptools``): the engine is reached over real sockets. One
  ``ClientSession`` with a connection pool is shared by every call, streamed ones included; a stream that
  was read to its end hands its connection back to the pool. aiohttp's client costs about a fifth of
  httpx's CPU per request and does not slow down with many open connections (httpcore's pool scans
  every connection on every request), which is what bounds a gateway in front of a fast engine.
* **httpx**, when an ``httpx`` transport is given (tests call an in-process fake engine through
  ``httpx.ASGITransport``), or when aiohttp is not installed.

Both map failures to the same three errors: :class:`UpstreamTimeout` (no answer within the timeout),
:class:`UpstreamUnreachable` (no connection, or it broke before the answer's head) and, while reading a
stream, :class:`UpstreamStreamError`.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx

__all__ = [
    "UpstreamTimeout",
    "UpstreamRefused",
    "UpstreamUnreachable",
    "UpstreamStreamError",
    "UpstreamResponse",
    "UpstreamClient",
    "upstream_client",
]


class UpstreamTimeout(Exception):
    """The engine did not answer within the gateway's timeout."""


class UpstreamUnreachable(Exception):
    """The engine could not be reached, or the connection broke before the answer's head."""


class UpstreamRefused(UpstreamUnreachable):
    """No connection to the engine could be opened (its process is gone, say): nothing of the request was
    sent, so sending it elsewhere is safe (the gateway answers 503, which HAProxy retries on another
    replica)."""


class UpstreamStreamError(Exception):
    """A streamed answer broke off while it was being read."""


async def _nothing() -> None:
    return None


class UpstreamResponse:
    """An engine's answer: status, and either the whole body or its lines (streams).

    Args:
        status_code: the HTTP status.
        content: the body, for non-streamed calls (``None`` for a stream).
        blocks: the body's bytes as they arrive, for streams; iterating raises
            :class:`UpstreamStreamError` when the stream breaks.
        close: hands the connection back (to the pool when the body was read to its end).
        read: for streams, a cheaper way to the same bytes than ``blocks``: the next piece, ``b""`` at the
            end (used by :meth:`read_block`).
        close_after_end: for streams, releases the call at once and lets the answer's last bytes arrive in
            the background for up to the given seconds (used by :meth:`close_after_end`).
    """

    def __init__(
        self,
        status_code: int,
        content: bytes | None = None,
        blocks: AsyncIterator[bytes] | None = None,
        close: Callable[[], Awaitable[None]] = _nothing,
        read: Callable[[], Awaitable[bytes]] | None = None,
        close_after_end: Callable[[float], None] | None = None,
    ) -> None:
        self.status_code, self.content, self._blocks, self._close = status_code, content, blocks, close
        self._read, self._close_after_end = read, close_after_end

    async def read_block(self) -> bytes:
        """The next piece of a streamed body as it arrives, ``b""`` at its end.

        Raises:
            UpstreamStreamError: the stream broke. RuntimeError: the response was not streamed.
        """
        if self._read is not None:
            return await self._read()
        blocks = self.aiter_bytes()
        while (block := await anext(blocks, None)) is not None:
            if block:
                return block
        return b""

    def close_after_end(self, wait_s: float) -> bool:
        """After a stream's last event: release the connection now and let the engine's closing bytes
        arrive in the background (for up to ``wait_s`` seconds), so the connection still returns to the
        pool and the caller does not wait for them. Returns whether this client does that; if not, read
        what is left (:meth:`read_block`) before :meth:`aclose`, or the connection is closed."""
        if self._close_after_end is None:
            return False
        close, self._close_after_end, self._close = self._close_after_end, None, _nothing
        close(wait_s)
        return True

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The streamed body, block by block as it arrives. Raises: ``RuntimeError`` if not streamed."""
        if self._blocks is None:
            raise RuntimeError("aiter_bytes() on a response that was not streamed")
        return self._blocks

    async def aread(self) -> bytes:
        """The whole body (for a stream: what was not read yet)."""
        if self.content is None:
            self.content = b"".join([block async for block in self.aiter_bytes()])
        return self.content

    @property
    def released(self) -> bool:
        """Whether the connection was already released (:meth:`aclose` has nothing left to do)."""
        return self._close is _nothing

    async def aclose(self) -> None:
        """Release the connection. Safe to call twice."""
        close, self._close = self._close, _nothing
        await close()


def _stream_error(exc: Exception) -> UpstreamStreamError:
    return UpstreamStreamError(f"{type(exc).__name__}: {exc}")


async def _stream_errors(
    blocks: AsyncIterator[bytes], errors: type[BaseException] | tuple[type[BaseException], ...]
) -> AsyncIterator[bytes]:
    """``blocks``, with a client's ``errors`` while reading raised as :class:`UpstreamStreamError`."""
    try:
        async for block in blocks:
            yield block
    except errors as exc:
        raise UpstreamStreamError(f"{type(exc).__name__}: {exc}") from exc


class UpstreamClient:
    """What the gateway needs of an HTTP client (see the module docstring for the implementations)."""

    async def post(self, url: str, content: bytes, headers: dict[str, str], stream: bool) -> UpstreamResponse:
        """Send ``POST url``; a streamed answer is returned once its head arrived.

        Raises:
            UpstreamTimeout, UpstreamUnreachable: see the module docstring.
        """
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close the pool."""
        raise NotImplementedError


class _HttpxClient(UpstreamClient):
    def __init__(self, transport: httpx.AsyncBaseTransport | None, timeout_s: float) -> None:
        timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        self._client = httpx.AsyncClient(transport=transport, timeout=timeout)

    async def post(self, url: str, content: bytes, headers: dict[str, str], stream: bool) -> UpstreamResponse:
        request = self._client.build_request("POST", url, content=content, headers=headers)
        try:
            response = await self._client.send(request, stream=stream)
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(type(exc).__name__) from exc
        except httpx.ConnectError as exc:
            raise UpstreamRefused(f"{type(exc).__name__}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise UpstreamUnreachable(f"{type(exc).__name__}: {exc}") from exc
        if not stream:
            return UpstreamResponse(response.status_code, response.content)
        blocks = _stream_errors(response.aiter_bytes(), httpx.HTTPError)
        return UpstreamResponse(response.status_code, None, blocks, response.aclose)

    async def aclose(self) -> None:
        await self._client.aclose()


class _AiohttpClient(UpstreamClient):
    def __init__(self, timeout_s: float) -> None:
        import aiohttp

        self._aiohttp = aiohttp
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=min(10.0, timeout_s), sock_read=timeout_s
        )
        self._session: Any = None

    def _open(self) -> Any:
        if self._session is None:  # inside the running loop, as aiohttp requires
            connector = self._aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
            self._session = self._aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                auto_decompress=True,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def post(self, url: str, content: bytes, headers: dict[str, str], stream: bool) -> UpstreamResponse:
        aiohttp = self._aiohttp
        try:
            response = await self._open().post(url, data=content, headers=headers)
            if not stream:
                try:
                    body = await response.read()
                finally:
                    response.release()
                return UpstreamResponse(response.status, body)
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamTimeout(type(exc).__name__) from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamRefused(f"{type(exc).__name__}: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamUnreachable(f"{type(exc).__name__}: {exc}") from exc

        blocks = _stream_errors(response.content.iter_any(), (TimeoutError, aiohttp.ClientError))

        async def close() -> None:
            response.release()  # back to the pool when read to the end, else the connection is closed

        return UpstreamResponse(response.status, None, blocks, close)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _H1Client(UpstreamClient):
    """:class:`~agentforge.gateway.h1.H1Client` for ``http://`` URLs; anything else goes to ``other``."""

    def __init__(self, timeout_s: float, other: UpstreamClient) -> None:
        from agentforge.gateway import h1

        self._h1 = h1
        self._client = h1.H1Client(read_s=timeout_s, connect_s=min(10.0, timeout_s))
        self._other = other
        self._served: dict[str, bool] = {}

    async def post(self, url: str, content: bytes, headers: dict[str, str], stream: bool) -> UpstreamResponse:
        served = self._served.get(url)
        if served is None:
            served = self._served[url] = self._h1.H1Client.serves(url)
        if not served:
            return await self._other.post(url, content, headers, stream)
        h1 = self._h1
        try:
            answer = await self._client.post(url, content, headers, stream)
        except h1.H1Timeout as exc:
            raise UpstreamTimeout(str(exc)) from exc
        except h1.H1Refused as exc:
            raise UpstreamRefused(str(exc)) from exc
        except h1.H1Error as exc:
            raise UpstreamUnreachable(str(exc)) from exc
        if not stream:
            return UpstreamResponse(answer.status, answer.body)

        async def close() -> None:
            answer.close()

        read = functools.partial(answer.read, _stream_error)
        return UpstreamResponse(
            answer.status, None, _stream_errors(answer.blocks(), h1.H1Error), close, read, answer.close
        )

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._other.aclose()


def upstream_client(transport: httpx.AsyncBaseTransport | None, timeout_s: float) -> UpstreamClient:
    """The gateway's upstream client (see the module docstring).

    Args:
        transport: an ``httpx`` transport (tests); forces the httpx implementation.
        timeout_s: seconds to wait for the engine to send (the head, then each read); connect: at most 10 s.
    """
    if transport is not None:
        return _HttpxClient(transport, timeout_s)
    other: UpstreamClient
    try:
        other = _AiohttpClient(timeout_s)
    except ImportError:
        other = _HttpxClient(None, timeout_s)
    try:
        return _H1Client(timeout_s, other)
    except ImportError:
        return other
