"""What the dialect routes share (:mod:`agentforge.gateway.anthropic`, :mod:`agentforge.gateway.responses`): the
chat request they hand the gateway's chat handler, and the chat stream's events read back for translation."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request

from agentforge.gateway.call import DIALECT_KEY

__all__ = ["chat_call", "translate_stream"]


def chat_call(request: Request, chat_body: bytes, dialect: str) -> Request:
    """The client's ``request`` (same scope: path parameters, headers, client) with ``chat_body`` as its body and
    the dialect marked (``scope[DIALECT_KEY]``, recorded on the span)."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": chat_body, "more_body": False}
        return await request.receive()

    scope = dict(request.scope)
    scope[DIALECT_KEY] = dialect
    return Request(scope, receive)


async def translate_stream(
    chunks: AsyncIterator[bytes], on_data: Callable[[bytes], bytes]
) -> AsyncIterator[bytes]:
    """The chat stream ``chunks`` (SSE bytes) → what ``on_data`` makes of each event's ``data:`` payload
    (``b"[DONE]"`` included), one piece per piece read. ``chunks`` is closed when done or closed early, so the
    relay under it ends and records the call."""
    buffer = b""
    try:
        async for piece in chunks:
            buffer += piece if isinstance(piece, bytes) else str(piece).encode()
            out = []
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                out.extend(
                    on_data(line[5:].strip()) for line in event.split(b"\n") if line.startswith(b"data:")
                )
            if any(out):
                yield b"".join(out)
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()
