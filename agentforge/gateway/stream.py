"""Relay an engine's server-sent-event stream to the client while capturing it.

The client receives valid SSE (``data: {...}\\n\\n`` ... ``data: [DONE]\\n\\n``) shaped by
:func:`~agentforge.gateway.wire.shape_chunk`. The span is written *before* ``[DONE]`` is sent, so a
client that finished reading the stream finds its span in the store. The router's in-flight count is
released exactly once: when the stream ends, fails, or the client disconnects (then the span is kept
with ``status="error"``, ``attributes["client_disconnected"] = True`` and what arrived so far).
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
from agentforge.gateway.tooldeltas import ToolCallDeltas
from agentforge.gateway.upstream import UpstreamResponse, UpstreamStreamError
from agentforge.gateway.wire import (
    ClientAsk,
    decode_json,
    decode_json_finite,
    encode_json,
    error_body,
    normalise_empty_arguments,
    shape_chunk,
)

logger = logging.getLogger("agentforge.gateway")

if TYPE_CHECKING:
    from agentforge.gateway.app import _Gateway
    from agentforge.gateway.call import CallContext

__all__ = ["SSEReader", "sse_batches", "StreamRelay", "relay_response"]

_DONE = b"data: [DONE]\n\n"
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
    ``None`` for anything else (partial events, comments, ``\\r``, multi-line data: the general parser)."""
    if not block.endswith(b"\n\n") or b"\r" in block:
        return None
    events = block[:-2].split(b"\n\n")
    for event in events:
        if not event.startswith(b"data: ") or b"\n" in event:
            return None
    return [event[6:] for event in events]


async def _drain(response: UpstreamResponse, limit: int = 64) -> None:
    """Read what is left of a finished stream (the engine's last bytes after ``[DONE]``) so that the
    keep-alive connection goes back to the pool instead of being closed; gives up after ``limit`` reads."""
    try:
        while limit > 0 and await response.read_block():
            limit -= 1
    except UpstreamStreamError:
        return


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + encode_json(data) + b"\n\n"


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
        gateway: _Gateway,
        ctx: CallContext,
        response: UpstreamResponse,
        ask: ClientAsk,
        release: Callable[[], None],
    ) -> None:
        self.gateway, self.ctx, self.response, self.ask, self._release = gateway, ctx, response, ask, release
        self.capture = StreamCapture(ctx.endpoint)
        self.tools = ToolCallDeltas()  # chat only: tool-call deltas in the shape clients accumulate
        self._recorded = False
        self._closed = False

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE bytes for the client: the events of each upstream read in one piece."""
        error: str | None = None
        reader, response = SSEReader(), self.response
        try:
            while block := await response.read_block():
                out: list[bytes] = []
                finished, error = self._relay_all(reader.feed(block), out)
                if out:
                    yield b"".join(out)
                if finished:
                    if not response.close_after_end(_DRAIN_S):  # a client that cannot: read the rest here
                        with anyio.CancelScope(shield=True), anyio.move_on_after(_DRAIN_S):
                            await _drain(response)
                    break
                if error is not None:
                    break
            else:
                out = []
                finished, error = self._relay_all(reader.end(), out)
                if out:
                    yield b"".join(out)
                # closed without [DONE]: the client must not take it as whole
                if not finished and error is None:
                    error = "upstream stream ended before [DONE]"
                    yield _event(error_body(error, "upstream_error", "upstream_stream_error"))
        except UpstreamStreamError as exc:  # the detail may name the engine's address: the log keeps it
            logger.warning("upstream stream for %s broke: %s", self.ctx.version, exc)
            error = f"upstream stream broke ({type(exc.__cause__ or exc).__name__})"
            yield _event(error_body(error, "upstream_error", "upstream_stream_error"))
        await self.finish(error)
        yield _DONE

    def _relay_all(self, payloads: list[bytes], out: list[bytes]) -> tuple[bool, str | None]:
        """Relay ``payloads`` into ``out`` up to ``[DONE]`` or an error: ``(finished, error)``."""
        for data in payloads:
            if data.strip() == b"[DONE]":
                return True, None
            error = self._relay(data, out)
            if error is not None:
                return False, error
        return False, None

    def _relay(self, data: bytes, out: list[bytes]) -> str | None:
        """Capture one upstream event and append what the client gets to ``out``; returns the error that
        ends the stream (an event that is not JSON, or the engine's error event), else ``None``."""
        try:
            try:
                chunk, finite = decode_json_finite(data)
            except UnicodeDecodeError:  # bytes that are not UTF-8 read as U+FFFD, as text decoding would
                chunk, finite = decode_json(data.decode("utf-8", "replace")), False
        except ValueError:
            error = (
                f"upstream sent a stream event that is not JSON: {data[:200].decode('utf-8', 'replace')!r}"
            )
            out.append(_event(error_body(error, "upstream_error", "bad_upstream_response")))
            return error
        if isinstance(chunk, dict) and isinstance(chunk.get("error"), dict):
            out.append(_event(chunk))
            return str(chunk["error"].get("message") or chunk["error"])
        if not isinstance(chunk, dict):
            return None
        if self.ctx.endpoint == "chat":  # before recording: the span accumulates what the client gets
            self.tools.repair(chunk)
        if self.capture.feed(chunk) and self.ctx.endpoint == "chat":
            normalise_empty_arguments(chunk, self.capture.empty_argument_indexes())
        shaped = shape_chunk(chunk, self.ask, self.ctx.version)
        if shaped is not None:
            out.append(b"data: " + encode_json(shaped, finite=finite) + b"\n\n")
        return None

    async def finish(self, error: str | None, flag: str = "upstream_error", **attributes: Any) -> None:
        """Release the version, close the upstream response and record the span (each at most once);
        a failed stream's span gets ``flag`` (``upstream_error``, or ``client_disconnected``)."""
        if not self._closed:
            self._closed = True
            self._release()
            with anyio.CancelScope(shield=True):
                await self.response.aclose()
        if self._recorded:
            return
        self._recorded = True
        flags = ([] if self.capture.finished else ["stream_incomplete"]) + self.tools.repairs
        llm = llm_call_from_response(
            self.capture.response(), endpoint=self.ctx.endpoint, request=self.ctx.body, model=self.ctx.model,
            version=self.ctx.version, stream=True, latency_s=self.ctx.latency_s(), extra_flags=flags,
        )  # fmt: skip
        if error is not None:
            llm.flags.append(flag)
            llm.trainable = False
        await self.gateway.record(self.ctx, llm, error=error, shield=True, **attributes)

    async def abort(self) -> None:
        """Finish after the client went away (no-op when the stream already finished)."""
        if self._recorded and self._closed:
            return
        await self.finish(
            "client disconnected before the stream ended",
            flag="client_disconnected",
            client_disconnected=True,
        )


class _RelayResponse(StreamingResponse):
    """The relay's SSE response, sent without ``StreamingResponse``'s task group and disconnect listener.

    On the gateway's fast path (:class:`~agentforge.gateway.fastpath.FastPathMiddleware`, which reads
    ``watch_disconnect``) the connection watcher that already guards the call keeps running while the
    stream is sent and cancels it when the client leaves; a server that raises on ``send`` to a
    disconnected client (ASGI 2.4) ends it too. Either way the relay always finishes: the span is
    recorded (``client_disconnected`` when the client left) and the version released.
    """

    watch_disconnect = True

    def __init__(self, relay: StreamRelay) -> None:
        super().__init__(
            relay.events(), media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )
        self.relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (OSError, ClientDisconnect):
            pass  # the client left: recorded by ``abort`` below; nothing left to answer
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
                await self.relay.abort()


def relay_response(relay: StreamRelay) -> StreamingResponse:
    """The client's streaming response for ``relay``."""
    return _RelayResponse(relay)
