"""Relay an engine's server-sent-event stream to the client while capturing it.

The client receives valid SSE (``data: {...}\\n\\n`` ... ``data: [DONE]\\n\\n``) shaped by
:func:`~agentforge.gateway.wire.shape_chunk`: the events of each read from the engine in one write. The span
is written *before* ``[DONE]`` is sent, so a client that finished reading the stream finds its span in the
store; the stream's last events (the finishing chunk, the usage chunk) wait for it too and end the response
with ``[DONE]`` in one write. Plain token chunks, nearly all of a stream, take a short path
(:meth:`~agentforge.gateway.capture.StreamCapture.feed_token`,
:func:`~agentforge.gateway.wire.shape_token_chunk`) that captures and forwards exactly what the general
one does. The router's in-flight count is released exactly once: when the stream ends, fails, or the client
disconnects (then the span is kept with ``status="error"``, ``attributes["client_disconnected"] = True`` and
what arrived so far).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from agentforge.gateway.capture import StreamCapture, llm_call_from_response
from agentforge.gateway.dialect_io import DialectStream
from agentforge.gateway.tooldeltas import ToolCallDeltas
from agentforge.gateway.upstream import UpstreamResponse, UpstreamStreamError
from agentforge.gateway.wire import (
    ORJSON_LOADS,
    ClientAsk,
    decode_json,
    decode_json_finite,
    encode_json,
    error_body,
    normalise_empty_arguments,
    shape_chunk,
    shape_token_chunk,
    short_numbers,
)

logger = logging.getLogger("agentforge.gateway")

if TYPE_CHECKING:
    from agentforge.gateway.call import CallContext
    from agentforge.gateway.host import CallHost

__all__ = ["SSEReader", "sse_batches", "StreamRelay", "relay_response"]

_DONE = b"data: [DONE]\n\n"
#: The stream's response headers, as ``StreamingResponse(media_type="text/event-stream", headers=...)`` sets them.
_SSE_HEADERS = ((b"cache-control", b"no-cache"), (b"content-type", b"text/event-stream; charset=utf-8"))
#: Longest wait for the engine's last bytes after ``[DONE]``, seconds; the connection is closed after it.
_DRAIN_S = 0.25


class SSEReader:
    """Incremental reader of server-sent events: the ``data`` payloads of the bytes fed so far.

    Payloads stay bytes (UTF-8 as the engine sent them) so that the JSON decoder reads them directly;
    multi-line data is joined with ``\\n``; comments and other fields are skipped.
    """

    __slots__ = ("_buf", "_lines")

    def __init__(self) -> None:
        self._buf, self._lines = b"", []

    def feed(self, block: bytes) -> list[bytes]:
        """The payloads of the events that ``block`` completes, in order (maybe none)."""
        if not self._buf and not self._lines and (simple := _simple_events(block)) is not None:
            return simple
        lines = self._lines
        *complete, self._buf = (self._buf + block).split(b"\n") if self._buf else block.split(b"\n")
        batch: list[bytes] = []
        for raw in complete:
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                if lines:
                    batch.append(lines[0] if len(lines) == 1 else b"\n".join(lines))
                    lines.clear()
            elif line.startswith(b"data:"):
                lines.append(line[6:] if line.startswith(b"data: ") else line[5:])
        return batch

    def end(self) -> list[bytes]:
        """The payload of an event the stream's end cut off before its blank line, if any."""
        buf, lines = self._buf, self._lines
        tail = buf[:-1] if buf.endswith(b"\r") else buf
        if tail.startswith(b"data:"):
            lines.append(tail[6:] if tail.startswith(b"data: ") else tail[5:])
        self._buf, self._lines = b"", []
        return [b"\n".join(lines)] if lines else []


async def sse_batches(response: UpstreamResponse) -> AsyncIterator[list[bytes]]:
    """The ``data`` payloads of ``response``'s server-sent events (see :class:`SSEReader`), one list per
    network read: events that arrived together are relayed together, in one write to the client."""
    reader = SSEReader()
    while block := await response.read_block():
        if batch := reader.feed(block):
            yield batch
    if rest := reader.end():
        yield rest


def _simple_events(block: bytes) -> list[bytes] | None:
    """The payloads of a block of whole one-line ``data: ...`` events (how vLLM writes each read), or
    ``None`` for anything else (partial events, comments, ``\\r``, multi-line data: the general parser).

    Split at C speed: when every newline of the block belongs to an event's closing ``\\n\\n``, the
    pieces between ``\\n\\ndata: `` are exactly the events' payloads."""
    if not block.startswith(b"data: ") or not block.endswith(b"\n\n") or b"\r" in block:
        return None
    events = block[6:-2].split(b"\n\ndata: ")
    return events if block.count(b"\n") == 2 * len(events) else None


async def _drain(response: UpstreamResponse, limit: int = 64) -> None:
    """Read what is left of a finished stream (the engine's last bytes after ``[DONE]``) so that the
    keep-alive connection goes back to the pool instead of being closed; gives up after ``limit`` reads."""
    try:
        while limit > 0 and await response.read_block():
            limit -= 1
    except UpstreamStreamError:
        return


class StreamRelay:
    """Owns one upstream stream: relays it, captures it, records the span and releases the version.

    Args:
        gateway: the gateway whose ``record`` writes the span.
        ctx: the call's context.
        response: the engine's open streaming response (status < 400).
        ask: what the client asked for.
        release: ends the call's in-flight count on the router (idempotent).
    """

    def __init__(
        self,
        gateway: CallHost,
        ctx: CallContext,
        response: UpstreamResponse,
        ask: ClientAsk,
        release: Callable[[], None],
    ) -> None:
        self.gateway, self.ctx, self.response, self.ask, self._release = gateway, ctx, response, ask, release
        self.capture = StreamCapture(ctx.endpoint)
        self.tools = ToolCallDeltas()  # chat only: tool-call deltas in the shape clients accumulate
        self._reader = SSEReader()
        #: a dialect route's translator (:func:`~agentforge.gateway.dialect_io.translate_response`): each chat
        #: event the client would get, as its decoded object (``None`` for ``[DONE]``) → the dialect's bytes
        self.translate: Callable[[dict[str, Any] | None], bytes] | None = None
        self._recorded = False
        self._closed = False
        self._ended = False  # [DONE] handed out

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE bytes for the client: the events of each upstream read in one piece; the last piece
        ends with ``[DONE]``."""
        while True:
            piece, last = await self.next_piece()
            if piece:
                yield piece
            if last:
                return

    async def next_piece(self) -> tuple[bytes, bool]:
        """The client's next bytes: the events of the next upstream read, and whether they are the last.

        The last piece holds the stream's final events and ``[DONE]`` together: it is returned once the span
        is recorded (see the module docstring), so the client gets the stream's end in one write.
        """
        if self._ended:
            return b"", True
        out: list[bytes] = []
        error: str | None = None
        response = self.response
        try:
            block = await response.read_block()
            if block:
                finished, error = self._relay_all(self._reader.feed(block), out, short_numbers(block))
                if not finished and error is None:
                    return b"".join(out), False
                if finished and not response.close_after_end(_DRAIN_S):  # a client that cannot: read here
                    with anyio.CancelScope(shield=True), anyio.move_on_after(_DRAIN_S):
                        await _drain(response)
            else:
                finished, error = self._relay_all(self._reader.end(), out, False)
                if not finished and error is None:  # closed without [DONE]: the client must not take it whole
                    error = "upstream stream ended before [DONE]"
                    out.append(self._event(error_body(error, "upstream_error", "upstream_stream_error")))
        except UpstreamStreamError as exc:  # the detail may name the engine's address: the log keeps it
            logger.warning("upstream stream for %s broke: %s", self.ctx.version, exc)
            error = f"upstream stream broke ({type(exc.__cause__ or exc).__name__})"
            out.append(self._event(error_body(error, "upstream_error", "upstream_stream_error")))
        self._ended = True
        await self.finish(error)
        out.append(_DONE if self.translate is None else self.translate(None))
        return b"".join(out), True

    def _relay_all(self, payloads: list[bytes], out: list[bytes], short: bool) -> tuple[bool, str | None]:
        """Relay ``payloads`` into ``out`` up to ``[DONE]`` or an error: ``(finished, error)``; ``short``:
        the payloads' block holds no long digit run (:func:`~agentforge.gateway.wire.short_numbers`), so
        orjson reads each payload exactly (the exact decoder takes what it refuses)."""
        feed_token, ask, version = self.capture.feed_token, self.ask, self.ctx.version
        loads, translate = ORJSON_LOADS if short else None, self.translate
        for data in payloads:
            if data[:1] != b"{" and data.strip() == b"[DONE]":
                return True, None
            try:
                if loads is not None:
                    try:
                        chunk, finite = loads(data), True
                    except ValueError:  # NaN, lone surrogates, or not JSON: the exact decoder says which
                        chunk, finite = decode_json_finite(data, short=True)
                else:
                    chunk, finite = decode_json_finite(data)
            except UnicodeDecodeError:  # bytes that are not UTF-8 read as U+FFFD, as text decoding would
                try:
                    chunk, finite = decode_json(data.decode("utf-8", "replace")), False
                except ValueError:
                    return False, self._not_json(data, out)
            except ValueError:
                return False, self._not_json(data, out)
            if type(chunk) is dict and (choice := feed_token(chunk)) is not None:
                shape_token_chunk(chunk, choice, ask, version)  # a token's chunk: nothing to repair
                if translate is None:
                    out.append(b"data: " + encode_json(chunk, finite=finite) + b"\n\n")
                else:
                    out.append(translate(chunk))
                continue
            error = self._relay(chunk, finite, out)
            if error is not None:
                return False, error
        return False, None

    def _event(self, chunk: dict[str, Any], finite: bool = True) -> bytes:
        """One event for the client: the chat event, or what the dialect's translator makes of it."""
        if self.translate is not None:
            return self.translate(chunk)
        return b"data: " + encode_json(chunk, finite=finite) + b"\n\n"

    def _not_json(self, data: bytes, out: list[bytes]) -> str:
        """The error event for an upstream event that is not JSON (appended to ``out``); returns its message."""
        error = f"upstream sent a stream event that is not JSON: {data[:200].decode('utf-8', 'replace')!r}"
        out.append(self._event(error_body(error, "upstream_error", "bad_upstream_response")))
        return error

    def _relay(self, chunk: Any, finite: bool, out: list[bytes]) -> str | None:
        """Capture one decoded upstream event (any shape) and append what the client gets to ``out``;
        returns the error that ends the stream (the engine's error event), else ``None``."""
        if isinstance(chunk, dict) and isinstance(chunk.get("error"), dict):
            out.append(self._event(chunk))
            return str(chunk["error"].get("message") or chunk["error"])
        if not isinstance(chunk, dict):
            return None
        if self.ctx.endpoint == "chat":  # before recording: the span accumulates what the client gets
            self.tools.repair(chunk)
        if self.capture.feed(chunk) and self.ctx.endpoint == "chat":
            normalise_empty_arguments(chunk, self.capture.empty_argument_indexes())
        shaped = shape_chunk(chunk, self.ask, self.ctx.version)
        if shaped is not None:
            out.append(self._event(shaped, finite))
        return None

    async def finish(self, error: str | None, flag: str = "upstream_error", **attributes: Any) -> None:
        """Release the version, close the upstream response and record the span (each at most once);
        a failed stream's span gets ``flag`` (``upstream_error``, or ``client_disconnected``)."""
        if not self._closed:
            self._closed = True
            self._release()
            if not self.response.released:  # after close_after_end: nothing left to close
                with anyio.CancelScope(shield=True):
                    await self.response.aclose()
        if self._recorded:
            return
        self._recorded = True
        flags = ([] if self.capture.finished else ["stream_incomplete"]) + self.tools.repairs
        llm = llm_call_from_response(
            self.capture.response(),
            endpoint=self.ctx.endpoint,
            request=self.ctx.body,
            model=self.ctx.model,
            version=self.ctx.version,
            stream=True,
            latency_s=self.ctx.latency_s(),
            extra_flags=flags,
        )
        if error is not None:
            llm.flags.append(flag)
            llm.trainable = False
        await self.gateway.record(
            self.ctx, llm, error=error, **attributes
        )  # the write itself always finishes

    @property
    def done(self) -> bool:
        """Whether the span is recorded and the upstream response closed."""
        return self._recorded and self._closed

    async def abort(self) -> None:
        """Finish after the client went away (no-op when the stream already finished)."""
        if self._recorded and self._closed:
            return
        await self.finish(
            "client disconnected before the stream ended",
            flag="client_disconnected",
            client_disconnected=True,
        )


class _RelayResponse(DialectStream):
    """The relay's SSE response, sent without ``StreamingResponse``'s task group and disconnect listener; its
    head is sent with the stream's first events (the engine's first read), not before them.

    On the gateway's fast path (:class:`~agentforge.gateway.fastpath.FastPathMiddleware`, which reads
    ``watch_disconnect``) the connection watcher that already guards the call keeps running while the
    stream is sent and cancels it when the client leaves; a server that raises on ``send`` to a
    disconnected client (ASGI 2.4) ends it too. Either way the relay always finishes: the span is
    recorded (``client_disconnected`` when the client left) and the version released.
    """

    watch_disconnect = True

    media_type = "text/event-stream"

    def __init__(self, relay: StreamRelay) -> None:  # what StreamingResponse's would set, without its checks
        self.relay = relay
        self.body_iterator = self._events = relay.events()
        self.status_code = 200
        self.background = None
        self.raw_headers = list(_SSE_HEADERS)

    def translate_at_source(self, on_chunk: Callable[[dict[str, Any] | None], bytes]) -> bool:
        """The relay's events go to ``on_chunk`` (a dialect route's translator) unless the stream is wrapped."""
        if self.body_iterator is not self._events:
            return False
        self.relay.translate = on_chunk
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        relay = self.relay
        own = self.body_iterator is self._events  # not wrapped (privacy restores through the iterator)
        start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        try:
            if own:  # the relay's pieces straight to the client; the last one ends the response
                piece, last = await relay.next_piece()  # the head leaves with it (one write: HeadWithBody)
                await send(start)
                while True:
                    if piece or last:
                        await send({"type": "http.response.body", "body": piece, "more_body": not last})
                    if last:
                        break
                    piece, last = await relay.next_piece()
            else:
                await send(start)
                async for chunk in self.body_iterator:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (OSError, ClientDisconnect):
            pass  # the client left: recorded by ``abort`` below; nothing left to answer
        finally:
            if not own or not relay.done:
                with anyio.CancelScope(shield=True):
                    await self.body_iterator.aclose()  # type: ignore[attr-defined]
                    await relay.abort()


def relay_response(relay: StreamRelay) -> StreamingResponse:
    """The client's streaming response for ``relay``."""
    return _RelayResponse(relay)
