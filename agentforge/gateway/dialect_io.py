"""What the dialect routes share (:mod:`agentforge.gateway.anthropic`, :mod:`agentforge.gateway.responses`): the
chat request they hand the gateway's chat handler, and the chat stream's events read back for translation."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import AsyncContentStream, StreamingResponse
from starlette.types import Message

from agentforge.gateway.call import DIALECT_KEY
from agentforge.gateway.wire import decode_json

__all__ = ["DialectStream", "chat_call", "error_message", "translate_response", "translate_stream"]


def chat_call(request: Request, chat_body: bytes, dialect: str) -> Request:
    """The client's ``request`` (same scope: path parameters, headers, client) with ``chat_body`` as its body and
    the dialect marked (``scope[DIALECT_KEY]``, recorded on the span)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": chat_body, "more_body": False}
        return await request.receive()

    scope = dict(request.scope)
    scope[DIALECT_KEY] = dialect
    return Request(scope, receive)


def error_message(chunk: dict[str, Any]) -> str:
    """The message of a chat stream's error event (``{"error": {...}}`` or ``{"error": "..."}``)."""
    error = chunk["error"]
    return str(error.get("message")) if isinstance(error, dict) else str(error)


def _decoded(data: bytes) -> dict[str, Any] | None | Literal[False]:
    """An event's ``data:`` payload: ``None`` for ``[DONE]``, the JSON object, or ``False`` for anything else."""
    if data == b"[DONE]":
        return None
    try:
        chunk = decode_json(data)
    except (ValueError, UnicodeDecodeError):
        return False
    return chunk if isinstance(chunk, dict) else False


async def translate_stream(
    chunks: AsyncContentStream, on_chunk: Callable[[dict[str, Any] | None], bytes]
) -> AsyncGenerator[bytes, None]:
    """The chat stream ``chunks`` (SSE bytes) → what ``on_chunk`` makes of each event's decoded JSON object
    (``None`` for ``[DONE]``; a payload that is not a JSON object is skipped), one piece per piece read.
    ``chunks`` is closed when done or closed early, so the relay under it ends and records the call."""
    buffer = b""
    try:
        async for piece in chunks:
            buffer += piece if isinstance(piece, bytes) else str(piece).encode()
            out = []
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    chunk = _decoded(line[5:].strip()) if line.startswith(b"data:") else False
                    if chunk is not False:
                        out.append(on_chunk(chunk))
            if any(out):
                yield b"".join(out)
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()


class DialectStream(StreamingResponse):
    """A chat stream a dialect route may translate at its source: the gateway's relay
    (:class:`~agentforge.gateway.stream.StreamRelay`) hands each event to the translator as the object it would
    have encoded for a chat client, so the dialect's events cost no encode and decode of the chat event."""

    def translate_at_source(self, on_chunk: Callable[[dict[str, Any] | None], bytes]) -> bool:
        """Have ``on_chunk`` make the client's bytes from each chat event (``None`` for ``[DONE]``); ``False``
        when this stream cannot (its events are rewritten after the relay, e.g. privacy's restore)."""
        return False


def translate_response(answer: StreamingResponse, on_chunk: Callable[[dict[str, Any] | None], bytes]) -> None:
    """Make the chat stream ``answer`` the dialect's: at its source where it is a :class:`DialectStream` that
    can, else by reading its SSE bytes back (:func:`translate_stream`)."""
    if isinstance(answer, DialectStream) and answer.translate_at_source(on_chunk):
        return
    answer.body_iterator = translate_stream(answer.body_iterator, on_chunk)
