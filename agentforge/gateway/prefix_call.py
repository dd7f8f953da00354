"""One engine call made by the gateway's own paths (token-in continuations, guided calls) and the client's
answer from it: errors recorded and answered as the ordinary path does, the span recorded, the answer shaped
for what the client asked (a stream is sent whole, as a short stream: :func:`~.prefix_wire.chat_events`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from agentforge.gateway.capture import llm_call_from_response
from agentforge.gateway.prefix_wire import chat_events
from agentforge.gateway.wire import (
    Endpoint,
    client_ask,
    decode_json,
    encode_json,
    error_body,
    shape_response,
    upstream_body,
    upstream_error_body,
)

if TYPE_CHECKING:
    from agentforge.gateway.call import CallContext
    from agentforge.gateway.host import CallHost
    from agentforge.gateway.router import Upstream
    from agentforge.types import LLMCall

__all__ = ["engine_call", "answer_client"]


async def engine_call(
    gateway: CallHost,
    ctx: CallContext,
    upstream: Upstream,
    endpoint: Endpoint,
    payload: dict[str, Any],
    release: Callable[[], None],
    flag: str,
) -> dict[str, Any] | Response:
    """POST ``payload`` (non-streamed, with the capture options) to the engine's ``endpoint``.

    Args:
        gateway: the gateway (pooled client, recorder).
        ctx: the client's call.
        upstream: the engine serving the resolved version.
        endpoint: ``"chat"`` or ``"completions"``.
        payload: the request body (``model`` and the capture options are set here).
        release: releases the version's in-flight count (called once the engine answered or failed).
        flag: the flag naming this path on the span of a call the client left.

    Returns:
        The engine's JSON answer, or the recorded error response for the client (502/504, the engine's
        status, or 502 for a body that is not a JSON object).

    Raises:
        asyncio.CancelledError: the client left (the call is recorded ``client_disconnected`` first).
    """
    content = encode_json(
        upstream_body({**payload, "stream": False}, endpoint, upstream, gateway.cache_salt(ctx))
    )
    response = await gateway.send(ctx, upstream, endpoint, content, False, flags=(flag,))
    if isinstance(response, JSONResponse):  # the engine timed out or was unreachable: recorded
        release()
        return response
    release()
    if response.status_code >= 400:
        err = upstream_error_body(response.status_code, response.content or b"")
        return await gateway.fail(ctx, response.status_code, err, "upstream_error")
    try:
        data = decode_json(response.content or b"")
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        msg = f"upstream answered HTTP {response.status_code} with a body that is not a JSON object: {exc}"
        code = "bad_upstream_response"
        return await gateway.fail(ctx, 502, error_body(msg, "upstream_error", code), code)
    return data


async def answer_client(
    gateway: CallHost,
    ctx: CallContext,
    answer: dict[str, Any],
    flags: list[str],
    adjust: Callable[[LLMCall], Any] | None = None,
) -> Response:
    """Record the chat ``answer`` (vLLM's shape with token ids) as the call's span and answer the client.

    Args:
        gateway: the gateway (recorder).
        ctx: the client's call.
        answer: the chat answer with ``prompt_token_ids``, ``choices[0].token_ids`` and logprobs.
        flags: flags added to the span.
        adjust: called with the call before it is recorded, to amend it (awaited when it returns an
            awaitable); what it returns, when a dict, is added to the span's attributes.

    Returns:
        The JSON answer, or a short SSE stream when the client asked for a stream.
    """
    ask = client_ask(ctx.body, "chat")
    llm = llm_call_from_response(
        answer,
        endpoint="chat",
        request=ctx.body,
        model=ctx.model,
        version=ctx.version,
        stream=ask.stream,
        latency_s=ctx.latency_s(),
        extra_flags=flags,
    )
    attributes: dict[str, Any] = {}
    if adjust is not None:
        pending = adjust(llm)
        if asyncio.iscoroutine(pending):
            pending = await pending
        if isinstance(pending, dict):
            attributes = pending
    await gateway.record(ctx, llm, **attributes)
    if ask.stream:
        return StreamingResponse(chat_events(answer, ask, ctx.version), media_type="text/event-stream")
    return Response(encode_json(shape_response(answer, ask, ctx.version)), media_type="application/json")
