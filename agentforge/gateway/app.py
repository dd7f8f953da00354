"""The gateway's HTTP app: OpenAI-compatible routes that forward to the engine and record one span per call.

Routes (each also under ``/rollouts/{rollout_id}``, which attributes the call to that rollout):

* ``POST /v1/chat/completions`` and ``POST /v1/completions``, streamed or not;
* ``GET /v1/models`` (every alias and version the :class:`~agentforge.gateway.router.ModelRouter` knows);
* ``GET /health``; the store's ``/api/...`` routes when ``include_store_api`` (same port for rewards).

Anything else is a 404 with an OpenAI-style body: vLLM's admin routes (``/v1/load_lora_adapter``, ...)
are never forwarded. Attribution: the URL prefix wins, else the ``X-Rollout-Id`` header; ``X-Attempt-Id``
is optional. A call without attribution is stored as an *orphan* span (``rollout_id=None``,
``attributes["orphan"] = True``) and the ``agentforge.gateway`` logger warns once per gateway. The
warning is a log record, not a :mod:`warnings` warning, on purpose: a warning raised inside a request
handler is either swallowed by the once-per-location filter or, under ``-W error``, turns a recorded
call into an HTTP 500. A span naming a rollout the store does not know is also kept as an orphan, with
``attributes["claimed_rollout_id"]``.

Errors reach the client as ``{"error": {"message", "type", "param", "code"}}``: malformed JSON or a bad
body → 400 (no upstream call), unknown model → 404 ``model_not_found``, engine errors → the engine's
status and message (e.g. vLLM's 400 for a prompt over the context limit), engine unreachable → 502,
engine timeout → 504, a body over ``max_request_bytes`` → 413 (not recorded). Every call whose body is a
JSON object is recorded, failed ones with ``status="error"`` and the message in ``Span.error`` (a client
that leaves before the answer: ``client_disconnected``). A failed store write is logged (``ERROR``) and
never breaks the client's answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentforge.errors import NotFoundError, UserError
from agentforge.gateway.call import (
    CallContext,
    clean_text,
    health_response,
    http_error,
    not_found,
    validate_body,
)
from agentforge.gateway.capture import llm_call_from_response
from agentforge.gateway.fastpath import DEFAULT_MAX_REQUEST_BYTES, GatewayApp
from agentforge.gateway.pins import PinCache
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.gateway.stream import StreamRelay, relay_response
from agentforge.gateway.upstream import (
    UpstreamClient,
    UpstreamResponse,
    UpstreamTimeout,
    UpstreamUnreachable,
    upstream_client,
)
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
from agentforge.loopback import check_key
from agentforge.types import (
    ATTEMPT_ID_HEADER,
    ROLLOUT_ID_HEADER,
    ROLLOUT_PATH_PREFIX,
    LLMCall,
    Span,
    SpanKind,
    now,
)

if TYPE_CHECKING:
    from agentforge.ports import TraceStore

__all__ = ["create_gateway", "CallContext"]

logger = logging.getLogger("agentforge.gateway")

_PATHS: dict[Endpoint, str] = {"chat": "/chat/completions", "completions": "/completions"}


class _Gateway:
    """State and handlers behind one gateway app."""

    def __init__(
        self,
        store: TraceStore,
        router: ModelRouter,
        transport: httpx.AsyncBaseTransport | None,
        timeout_s: float,
    ) -> None:
        self.store, self.router = store, router
        self._transport, self._timeout_s = transport, timeout_s
        self._client: UpstreamClient | None = upstream_client(transport, timeout_s)  # pool opens on use
        self._orphan_warned = False
        self.pins = PinCache(store, router)
        self.orphans = 0

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> Any:
        yield
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def client(self) -> UpstreamClient:
        """The pooled upstream client (its connection pool opens on the first request)."""
        if self._client is None:
            self._client = upstream_client(self._transport, self._timeout_s)
        return self._client

    # --- recording ------------------------------------------------------------------------------
    async def record(
        self,
        ctx: CallContext,
        llm: LLMCall,
        error: str | None = None,
        *,
        shield: bool = False,
        **attributes: Any,
    ) -> None:
        """Write the call's span; store failures are logged, not raised. The write itself always finishes
        (``asyncio.shield``); ``shield`` also shields the wait from anyio cancel scopes (a streamed
        response's task group cancels when its client leaves; a unary call has none)."""
        span = Span(
            rollout_id=ctx.rollout_id,
            attempt_id=ctx.attempt_id,
            kind=SpanKind.llm,
            name=f"{ctx.endpoint}.completions" if ctx.endpoint == "chat" else "completions",
            status="error" if error else "ok",
            error=clean_text(error) if error else None,
            llm=llm,
            attributes={"endpoint": ctx.endpoint, **attributes},
            started_at=ctx.started_at,
            ended_at=now(),
        )
        if ctx.rollout_id is None and ctx.attempt_id is None:  # the store finds an attempt's rollout
            self._orphan(span, "no rollout id in the URL or X-Rollout-Id header")
        if shield:
            with anyio.CancelScope(shield=True):
                await self._write(span)
        else:
            await self._write(span)

    def _orphan(self, span: Span, why: str) -> None:
        span.attributes["orphan"] = True
        self.orphans += 1
        level = logging.DEBUG if self._orphan_warned else logging.WARNING
        self._orphan_warned = True
        logger.log(
            level,
            "gateway call stored as an orphan span (%s); point the client at <gateway>/rollouts/<rollout_id>/v1 "
            "or send the X-Rollout-Id header to attribute it",
            why,
        )

    async def _write(self, span: Span) -> None:
        """Hand the span to the store's group-commit writer and wait until it is committed (the event loop
        is never blocked; concurrent calls share one transaction). A span the store rejects for its
        rollout is kept as an orphan with ``claimed_rollout_id``."""
        try:
            try:  # shielded: a caller that leaves must not cancel the queued write
                stored = await asyncio.shield(asyncio.wrap_future(self.store.submit(span)))
                if stored.attributes.get("late") is True:  # quarantined by the store (DESIGN fact 8)
                    logger.warning(
                        "late call stored as a late span %s (not training data): %s",
                        span.span_id,
                        stored.attributes.get("late_reason"),
                    )
            except (NotFoundError, UserError) as exc:
                if span.rollout_id is None:
                    raise
                claimed = span.rollout_id
                span = span.model_copy(update={"rollout_id": None, "attempt_id": None})
                span.attributes = {**span.attributes, "claimed_rollout_id": clean_text(claimed)}
                self._orphan(span, f"the store rejected rollout {claimed!r}: {exc}")
                await asyncio.shield(asyncio.wrap_future(self.store.submit(span)))
        except Exception:
            logger.exception("could not store the span of a gateway call (span %s)", span.span_id)

    def failed_call(self, ctx: CallContext, **fields: Any) -> LLMCall:
        """The LLMCall of a call that produced no answer."""
        return LLMCall(
            model=ctx.model, version=ctx.version, endpoint=ctx.endpoint, stream=bool(ctx.body.get("stream")),
            request=ctx.body, latency_s=ctx.latency_s(), trainable=False, **fields,
        )  # fmt: skip

    async def fail(self, ctx: CallContext, status: int, body: dict[str, Any], flag: str) -> JSONResponse:
        """Record a failed span and return the OpenAI-style error to the client."""
        await self.record(
            ctx, self.failed_call(ctx, flags=[flag]), error=body["error"]["message"], http_status=status
        )
        return JSONResponse(body, status_code=status)

    # --- handlers -------------------------------------------------------------------------------
    async def handle(self, request: Request, endpoint: Endpoint) -> Response:
        """Validate, resolve, forward and record one call."""
        rollout_id = request.path_params.get("rollout_id") or request.headers.get(ROLLOUT_ID_HEADER) or None
        attempt_id = request.headers.get(ATTEMPT_ID_HEADER) or None
        try:
            body = decode_json(await request.body())
        except (ValueError, UnicodeDecodeError) as exc:
            logger.warning("rejected a request with a malformed JSON body: %s", exc)
            return JSONResponse(
                error_body(f"request body is not valid JSON: {exc}", "invalid_request_error", "invalid_json"),
                400,
            )
        if not isinstance(body, dict):
            return JSONResponse(
                error_body("request body must be a JSON object", "invalid_request_error", "invalid_json"), 400
            )
        ctx = CallContext(endpoint, body, rollout_id, attempt_id)
        problem = validate_body(body, endpoint)
        if problem is not None:
            return await self.fail(
                ctx,
                400,
                error_body(problem[1], "invalid_request_error", "invalid_value", problem[0]),
                "invalid_request",
            )
        target = ctx.model
        if rollout_id is not None:
            if rollout_id in self.pins:  # cached: no thread hop on the hot path
                target = self.pins.target(rollout_id, ctx.model)
            else:
                target = await anyio.to_thread.run_sync(self.pins.target, rollout_id, ctx.model)
        try:
            ctx.version, upstream = self.router.acquire(target)
        except NotFoundError as exc:
            return await self.fail(
                ctx,
                404,
                error_body(str(exc), "invalid_request_error", "model_not_found", "model"),
                "model_not_found",
            )
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.router.release(ctx.version)

        try:
            response = await self._forward(ctx, upstream, release)
        except BaseException:
            release()
            raise
        if not isinstance(response, StreamingResponse):
            release()  # a stream's relay releases when the stream ends or the client leaves
        return response

    async def _send(
        self, ctx: CallContext, upstream: Upstream, stream: bool
    ) -> UpstreamResponse | JSONResponse:
        """Send the request upstream; a transport failure becomes a recorded 502/504 error response."""
        headers = {"content-type": "application/json"}
        if upstream.api_key:
            headers["authorization"] = f"Bearer {upstream.api_key}"
        url = upstream.base_url.rstrip("/") + _PATHS[ctx.endpoint]
        content = encode_json(upstream_body(ctx.body, ctx.endpoint, upstream))
        try:
            return await self.client.post(url, content, headers, stream)
        except asyncio.CancelledError:  # the client left (fastpath): close the upstream call, record it
            await self.record(
                ctx, self.failed_call(ctx, flags=["client_disconnected"]),
                error="client disconnected before the engine answered", client_disconnected=True,
            )  # fmt: skip
            raise
        except UpstreamTimeout as exc:  # the client's message never names the engine's address; the log does
            logger.warning("upstream %s for %s timed out: %s", upstream.base_url, ctx.version, exc)
            msg = f"the engine serving {ctx.version} timed out after {self._timeout_s} s"
            return await self.fail(
                ctx, 504, error_body(msg, "upstream_timeout", "upstream_timeout"), "upstream_timeout"
            )
        except UpstreamUnreachable as exc:
            logger.warning("upstream %s for %s is unreachable: %s", upstream.base_url, ctx.version, exc)
            cause = type(exc.__cause__ or exc).__name__
            msg = f"the engine serving {ctx.version} is unreachable ({cause})"
            return await self.fail(
                ctx,
                502,
                error_body(msg, "upstream_unreachable", "upstream_unreachable"),
                "upstream_unreachable",
            )

    async def _forward(self, ctx: CallContext, upstream: Upstream, release: Callable[[], None]) -> Response:
        stream = bool(ctx.body.get("stream"))
        response = await self._send(ctx, upstream, stream)
        if isinstance(response, JSONResponse):
            release()
            return response
        if response.status_code >= 400:
            content = await response.aread()
            await response.aclose()
            release()
            body = upstream_error_body(response.status_code, content)
            return await self.fail(ctx, response.status_code, body, "upstream_error")
        ask = client_ask(ctx.body, ctx.endpoint)
        if stream:
            relay = StreamRelay(self, ctx, response, ask, release)
            return relay_response(relay)
        try:
            data = decode_json(response.content or b"")
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            msg = (
                f"upstream answered HTTP {response.status_code} with a body that is not a JSON object: {exc}"
            )
            return await self.fail(
                ctx, 502, error_body(msg, "upstream_error", "bad_upstream_response"), "bad_upstream_response"
            )
        llm = llm_call_from_response(
            data, endpoint=ctx.endpoint, request=ctx.body, model=ctx.model, version=ctx.version,
            latency_s=ctx.latency_s(),
        )  # fmt: skip
        await self.record(ctx, llm)
        return Response(encode_json(shape_response(data, ask, ctx.version)), media_type="application/json")

    async def models(self) -> JSONResponse:
        """``GET /v1/models`` in OpenAI's list shape."""
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "agentforge"} for m in self.router.models()
        ]
        return JSONResponse({"object": "list", "data": data})


def create_gateway(
    store: TraceStore,
    router: ModelRouter,
    api_key: str | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    timeout_s: float = 600.0,
    include_store_api: bool = True,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    admin_key: str | None = None,
    adapter_root: str | Path | None = None,
) -> FastAPI:
    """Build the gateway app (see the module docstring for routes, attribution and errors).

    Args:
        store: where spans are written (``submit``: the store's group-commit writer; each call's answer
            is sent only after its span is committed).
        router: resolves model names to versions and upstreams; counts in-flight requests.
        api_key: when set, every route except ``/health`` requires ``Authorization: Bearer <api_key>``
            (the store routes check it themselves, with the store's error format).
        transport: httpx transport for upstream requests (tests pass ``ScriptedUpstream.transport()``).
        timeout_s: per-request upstream timeout, seconds (connect: at most 10 s).
        include_store_api: mount ``agentforge.stores.server.store_router(store)`` when that module exists.
        max_request_bytes: the largest LLM request body taken (bytes); larger ones get a 413, unstored.
        admin_key: the mounted store API's admin key (publishing and activating versions); ``None``
            closes those routes (see :mod:`agentforge.stores.admin`).
        adapter_root: the directory adapters may be published from through the mounted store API.

    Without ``api_key`` the app serves only requests that arrived on a loopback interface, whichever
    ASGI server runs it (:class:`~agentforge.loopback.LoopbackGuard`).

    Returns:
        The FastAPI app; ``app.state.gateway.orphans`` counts orphan spans written.

    Raises:
        UserError: ``api_key`` is shorter than :data:`~agentforge.loopback.MIN_KEY_LENGTH` characters.
    """
    check_key(api_key, "gateway")
    gateway = _Gateway(store, router, transport, timeout_s)
    app = GatewayApp(
        title="agentforge gateway", lifespan=gateway.lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.gateway = gateway
    # the key check (or the loopback guard) first, then LLM calls skip FastAPI's stack
    app.serve_llm_routes(gateway.handle, api_key, max_request_bytes)

    def handler(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            return await gateway.handle(request, endpoint)

        return route

    for prefix in ("", ROLLOUT_PATH_PREFIX + "{rollout_id}"):
        app.add_api_route(prefix + "/v1/chat/completions", handler("chat"), methods=["POST"])
        app.add_api_route(prefix + "/v1/completions", handler("completions"), methods=["POST"])
        app.add_api_route(prefix + "/v1/models", gateway.models, methods=["GET"])

    async def health() -> JSONResponse:
        return health_response(router)

    app.add_api_route("/health", health, methods=["GET"])
    if include_store_api:
        try:
            from agentforge.stores.server import store_router
        except ImportError:
            logger.debug("agentforge.stores.server is not available; the store API is not mounted")
        else:
            app.include_router(
                store_router(store, api_key=api_key, admin_key=admin_key, adapter_root=adapter_root)
            )
    app.add_api_route("/{path:path}", not_found, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    app.add_exception_handler(StarletteHTTPException, http_error)  # e.g. 405: OpenAI's shape too
    return app
