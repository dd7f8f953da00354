"""The gateway's HTTP app: OpenAI-compatible routes that forward to the engine and record one span per call.

Routes (each also under ``/rollouts/{rollout_id}``, which attributes the call to that rollout):

* ``POST /v1/chat/completions`` and ``POST /v1/completions``, streamed or not;
* ``GET /v1/models`` (every alias and version the :class:`~agentforge.gateway.router.ModelRouter` knows);
* ``GET /health``; the store's ``/api/...`` routes when ``include_store_api`` (same port for rewards).

Anything else is a 404 with an OpenAI-style body: vLLM's admin routes (``/v1/load_lora_adapter``, ...)
are never forwarded. Attribution: the URL prefix wins, else the ``X-Rollout-Id`` header; ``X-Attempt-Id``
is optional. A call without attribution is stored as an *orphan* span (``rollout_id=None``,
``attributes["orphan"] = True``) and the ``agentforge.gateway`` logger warns (at most once a minute). The
warning is a log record, not a :mod:`warnings` warning, on purpose: a warning raised inside a request
handler is either swallowed by the once-per-location filter or, under ``-W error``, turns a recorded
call into an HTTP 500. A span naming a rollout the store does not know is also kept as an orphan, with
``attributes["claimed_rollout_id"]``; one naming an attempt the store does not know (or another rollout's)
stays in its rollout with ``attributes["claimed_attempt_id"]``, not trainable (flag ``attempt_rejected``).

Errors reach the client as ``{"error": {"message", "type", "param", "code"}}``: malformed JSON or a bad body →
400 (no upstream call), unknown model → 404 ``model_not_found``, engine errors → the engine's status and
message (e.g. vLLM's 400 for a prompt over the context limit), engine refusing the connection → 503
``engine_unavailable`` (nothing was sent), connection broken → 502, engine timeout → 504, a body over
``max_request_bytes`` → 413 (not recorded). Every call whose body is a JSON object is recorded, failed ones
with ``status="error"`` and the message in ``Span.error`` (a client that leaves before the answer:
``client_disconnected``). A failed store write is logged (``ERROR``) and never breaks the client's answer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentforge.bodylimit import BodyLimit
from agentforge.errors import NotFoundError, ServingError
from agentforge.gateway.anthropic import messages_route
from agentforge.gateway.auth import ApiKeyMiddleware
from agentforge.gateway.call import (
    DIALECT_KEY,
    CallContext,
    health_response,
    http_error,
    lone_surrogate,
    not_found,
    validate_body,
)
from agentforge.gateway.capture import llm_call_from_response
from agentforge.gateway.fastpath import DEFAULT_MAX_REQUEST_BYTES, GatewayApp, LLMRoute
from agentforge.gateway.pins import PinCache
from agentforge.gateway.prefix_wire import UpstreamTokens, engine_headers
from agentforge.gateway.probation import VersionRefused
from agentforge.gateway.record import SpanRecorder
from agentforge.gateway.responses import responses_route
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.gateway.stream import StreamRelay, relay_response
from agentforge.gateway.tenancy import GatewayTenants, TenantModels, TenantRefused
from agentforge.gateway.upstream import (
    UpstreamClient,
    UpstreamRefused,
    UpstreamResponse,
    UpstreamTimeout,
    UpstreamUnreachable,
    upstream_client,
)
from agentforge.gateway.wire import (
    MAX_JSON_DEPTH,
    Endpoint,
    client_ask,
    decode_json,
    decode_json_finite,
    encode_json,
    error_body,
    json_depth,
    shape_response,
    upstream_body,
    upstream_error_body,
)
from agentforge.loopback import check_key
from agentforge.privacy.config import PrivacyConfig, PrivacyMode
from agentforge.privacy.flight import CallPrivacy, PrivacyGuard, ScanTooLargeError
from agentforge.types import (
    ATTEMPT_ID_HEADER,
    ROLLOUT_ID_HEADER,
    ROLLOUT_PATH_PREFIX,
)

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from agentforge.ports import TenantDirectory, TraceStore
    from agentforge.privacy.answer import EngineTokens

__all__ = ["create_gateway", "CallContext"]

logger = logging.getLogger("agentforge.gateway")

_PATHS: dict[Endpoint, str] = {"chat": "/chat/completions", "completions": "/completions"}


class _EngineRefused(Exception):
    """An engine of a pool refused a call's connection and another engine of the pool serves: ``handle``
    sends the call there (raised by :meth:`_Gateway.send`; never reaches a client)."""


class _Gateway(SpanRecorder):
    """State and handlers behind one gateway app (recording: :class:`~agentforge.gateway.record.SpanRecorder`)."""

    tenants: GatewayTenants | None = None  # set by create_gateway when tenants are configured

    def __init__(
        self,
        store: TraceStore,
        router: ModelRouter,
        transport: httpx.AsyncBaseTransport | None,
        timeout_s: float,
        privacy: PrivacyConfig | None = None,
    ) -> None:
        super().__init__(store)
        policy = PrivacyConfig() if privacy is None else privacy  # privacy is on wherever a gateway is built
        if policy.mode is PrivacyMode.off:
            logger.warning(
                "privacy off: requests reach the engine and the store as sent, personal data included "
                "(docs/privacy.md; the default is mask)"
            )
        self.privacy = PrivacyGuard(policy) if policy.mode is not PrivacyMode.off else None
        self.router = router
        self._transport, self._timeout_s = transport, timeout_s
        self._client: UpstreamClient | None = upstream_client(transport, timeout_s)  # pool opens on use
        self.pins = PinCache(store, router)

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
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

    def cache_salt(self, ctx: CallContext) -> str | None:
        """The engine prefix-cache salt of the call's tenant (:meth:`GatewayTenants.cache_salt`), or ``None``."""
        return self.tenants.cache_salt(ctx.tenant) if self.tenants is not None else None

    def engine_tokens(self, ctx: CallContext) -> EngineTokens | None:
        """The served engine's ``/detokenize`` and ``/tokenize`` (engines that render on ``/tokenize`` only)."""
        upstream = ctx.upstream
        return UpstreamTokens(self.client, upstream) if upstream is not None and upstream.token_in else None

    # --- handlers -------------------------------------------------------------------------------
    async def handle(self, request: Request, endpoint: Endpoint) -> Response:
        """Validate, resolve, forward and record one call."""
        rollout_id = request.path_params.get("rollout_id") or request.headers.get(ROLLOUT_ID_HEADER) or None
        attempt_id = request.headers.get(ATTEMPT_ID_HEADER) or None
        try:
            raw = await request.body()
            body, exact = decode_json_finite(raw)  # exact: orjson read it
            if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and json_depth(body) > MAX_JSON_DEPTH:
                raise ValueError(f"JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)")
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
        ctx.dialect = request.scope.get(DIALECT_KEY)
        refusal = await self._claim(request, ctx) if self.tenants is not None else None
        if self.privacy is not None:  # personal data masked before anything sees or stores it
            try:  # off the loop; a refused claim has no rollout here: its values join no rollout's mapping
                ctx.body, ctx.privacy = await self.privacy.abegin(ctx.rollout_id, endpoint, body)
            except ScanTooLargeError as exc:  # neither forwarded nor stored, like a body over the size limit
                logger.warning("refused a request whose privacy scan is over the limit: %s", exc)
                return JSONResponse(error_body(str(exc), "invalid_request_error", "request_too_large"), 413)
        if refusal is not None:
            return await self.fail(ctx, *refusal)
        problem = validate_body(body, endpoint)
        if problem is None and not exact:  # only orjson's refusals can hold lone surrogates
            problem = lone_surrogate(body)
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
            if self.tenants is None:
                ctx.version, upstream = self.router.acquire(target, rollout_id)
            else:
                ctx.version, upstream = await self.tenants.acquire(ctx.tenant, target)  # as _claim settled it
            ctx.logprobs_mode, ctx.upstream = upstream.logprobs_mode, upstream
        except ServingError as exc:
            if self.tenants is None:  # an engine pool with no engine serving (each down or restarting)
                return await self._engines_down(ctx, exc)
            # a tenant's adapter could not be loaded (slots busy, engine refused it)
            logger.warning("tenant %s: %s", ctx.tenant, exc)  # names other tenants' versions: the log only
            msg = f"the adapter of tenant {ctx.tenant!r} cannot be loaded now; retry shortly"
            body = error_body(msg, "server_error", "tenant_adapter_unavailable")
            return await self.fail(ctx, 503, body, "tenant_adapter_unavailable")
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

        while True:
            try:
                response = await self._forward(ctx, upstream, release)
            except VersionRefused as refused:  # held for a canary that failed: ask the version before it
                release()
                ctx.version, upstream = self.router.acquire(refused.fallback, rollout_id)
                ctx.upstream, released = upstream, False
                continue
            except _EngineRefused:  # nothing was sent: another engine of the version's pool gets the call
                release()
                try:
                    ctx.version, upstream = self.router.acquire(ctx.version, rollout_id, ctx.refused)
                except ServingError as exc:  # it stopped serving meanwhile
                    return await self._engines_down(ctx, exc)
                ctx.upstream, released = upstream, False
                continue
            except BaseException:
                release()
                raise
            break
        if not isinstance(response, StreamingResponse):
            release()  # a stream's relay releases when the stream ends or the client leaves
        if ctx.privacy is not None and ctx.privacy.mode is PrivacyMode.mask:
            return _restored(response, ctx.privacy)
        return response

    async def _engines_down(self, ctx: CallContext, exc: ServingError) -> JSONResponse:
        """The recorded 503 ``engine_unavailable`` of a call whose version's pool has no engine to take it."""
        body = error_body(f"the policy's engines are down: {exc}", "server_error", "engine_unavailable")
        return await self.fail(ctx, 503, body, "engine_unavailable")

    async def _claim(self, request: Request, ctx: CallContext) -> tuple[int, dict[str, Any], str] | None:
        """Settle whom the call acts for before anything is masked, validated or recorded (with tenants).

        Sets ``ctx.tenant``: the key's tenant, the trusted ``X-Tenant`` header's, or for the app's own key
        the tenant of the rollout it names. A tenant's call may name only its own rollouts: one that names
        another tenant's (or a shared) rollout is refused as if that rollout did not exist, and its span —
        like that of a refused tenant header — names no rollout, so nothing lands in another tenant's traces.
        A tenant's ``X-Attempt-Id`` counts only beside a rollout id (the store checks that the attempt is
        that rollout's).

        Returns:
            ``None`` to go on, or ``(status, error body, flag)`` for :meth:`fail` once the body is masked.
        """
        assert self.tenants is not None
        try:
            tenant = self.tenants.tenant(request)
        except TenantRefused as exc:
            ctx.rollout_id = ctx.attempt_id = None
            return 403, error_body(str(exc), "permission_error", "tenant_refused"), "tenant_refused"
        rollout_id = ctx.rollout_id
        if rollout_id is not None:
            known = rollout_id in self.pins or await anyio.to_thread.run_sync(self.pins.known, rollout_id)
            owner = self.pins.owner(rollout_id)  # None for a rollout the store does not hold
            if known and tenant is not None and owner != tenant:
                ctx.rollout_id = ctx.attempt_id = None
                ctx.tenant = tenant
                body = error_body(
                    f"rollout {rollout_id!r} does not exist", "invalid_request_error", "rollout_not_found"
                )
                return 404, body, "rollout_not_found"
            ctx.tenant = owner if tenant is None else tenant
        else:
            if tenant is not None:
                ctx.attempt_id = None
            ctx.tenant = tenant
        return None

    async def send(
        self,
        ctx: CallContext,
        upstream: Upstream,
        endpoint: Endpoint,
        content: bytes,
        stream: bool,
        flags: tuple[str, ...] = (),
    ) -> UpstreamResponse | JSONResponse:
        """POST ``content`` to ``upstream``'s ``endpoint`` route; a transport failure becomes a recorded
        502/504 error response (503 ``engine_unavailable`` when no connection could be opened: nothing was
        sent, so a load balancer may retry it on another replica), a client that leaves meanwhile a
        ``client_disconnected`` span (with ``flags``) before the cancellation goes on. The ordinary path and
        token-in continuations (:mod:`agentforge.gateway.prefix_call`) both send through here. The answer of a
        version on probation waits here for its canary's verdict (:mod:`agentforge.gateway.probation`:
        ``VersionRefused`` if it failed, and ``handle`` sends the call again to the version before it)."""
        url = upstream.base_url.rstrip("/") + _PATHS[endpoint]
        try:
            response = await self.client.post(url, content, engine_headers(upstream), stream)
            probation = self.router.probation(ctx.version)
            if probation is not None:  # canary pending: hold the answer (VersionRefused if it fails)
                await probation.hold(response)
            return response
        except asyncio.CancelledError:  # the client left (fastpath): close the upstream call, record it
            await self.record(
                ctx,
                self.failed_call(ctx, flags=["client_disconnected", *flags]),
                error="client disconnected before the engine answered",
                client_disconnected=True,
            )
            raise
        except UpstreamTimeout as exc:  # the client's message never names the engine's address; the log does
            logger.warning("upstream %s for %s timed out: %s", upstream.base_url, ctx.version, exc)
            msg = f"the engine serving {ctx.version} timed out after {self._timeout_s} s"
            return await self.fail(
                ctx, 504, error_body(msg, "upstream_timeout", "upstream_timeout"), "upstream_timeout"
            )
        except UpstreamRefused as exc:  # nothing was sent: a 503 that a load balancer may send elsewhere
            logger.warning(
                "upstream %s for %s refused the connection: %s", upstream.base_url, ctx.version, exc
            )
            ctx.refused |= {upstream.base_url}
            if self.router.has_other_engine(ctx.version, ctx.refused):  # another engine of its pool takes it
                raise _EngineRefused from exc
            msg = f"the engine serving {ctx.version} is not accepting connections (nothing was sent); retry"
            return await self.fail(
                ctx, 503, error_body(msg, "server_error", "engine_unavailable"), "engine_unavailable"
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
        if self.prefix.wants(ctx):  # a rollout's follow-up or guided call: gateway/prefix.py
            continued = await self.prefix.forward(self, ctx, upstream, release)
            if continued is not None:
                return continued
        stream = bool(ctx.body.get("stream"))
        content = encode_json(upstream_body(ctx.body, ctx.endpoint, upstream, self.cache_salt(ctx)))
        response = await self.send(ctx, upstream, ctx.endpoint, content, stream)
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
            data,
            endpoint=ctx.endpoint,
            request=ctx.body,
            model=ctx.model,
            version=ctx.version,
            latency_s=ctx.latency_s(),
        )
        await self.record(ctx, llm)
        return Response(encode_json(shape_response(data, ask, ctx.version)), media_type="application/json")

    async def models(self, request: Request) -> JSONResponse:
        """``GET /v1/models`` in OpenAI's list shape (a tenant's call lists no other tenant's versions)."""
        names = self.router.models()
        if self.tenants is not None:
            try:
                tenant = self.tenants.tenant(request)
            except TenantRefused as exc:
                return JSONResponse(error_body(str(exc), "permission_error", "tenant_refused"), 403)
            if tenant is not None:
                names = [m for m in names if self.tenants.visible(tenant, m)]
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "agentforge"} for m in names]
        return JSONResponse({"object": "list", "data": data})


def _restored(response: Response, privacy: CallPrivacy) -> Response:
    """The client's answer with the real values back in place of the call's placeholders."""
    if isinstance(response, StreamingResponse):
        response.body_iterator = privacy.restore_sse(response.body_iterator)  # type: ignore[arg-type]
        return response
    try:
        data = decode_json(bytes(response.body))
    except (ValueError, UnicodeDecodeError):
        return response
    if not isinstance(data, dict):
        return response
    body = encode_json(privacy.restore_body(data))
    return Response(body, status_code=response.status_code, media_type=response.media_type)


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
    tenants: TenantDirectory | None = None,
    tenant_models: TenantModels | None = None,
    tenant_header: bool = False,
    mounts: Mapping[str, ASGIApp] | None = None,
    privacy: PrivacyConfig | None = None,
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
        tenants: where tenant keys are looked up (:mod:`agentforge.stores.tenants`): a tenant key is taken in
            place of ``api_key``, on the LLM routes and the store API, and acts for its tenant only
            (:mod:`agentforge.gateway.tenancy`).
        tenant_models: serving's tenant adapters (:class:`~agentforge.serving.tenants.TenantAdapters`): a
            tenant's ``policy`` is its own lineage's live version, loaded on demand.
        tenant_header: take the tenant from ``X-Tenant`` for callers with the gateway key (or any loopback
            caller of a gateway without a key).
        mounts: apps to serve under path prefixes on the same port (``{"/dashboard": app}``); each checks
            ``api_key`` itself (the gateway's key check lets their paths through, its loopback rule does not).
        privacy: the privacy policy (:mod:`agentforge.privacy`); ``None``: the default policy, mask in flight
            (``PrivacyConfig()``). Mode ``off`` forwards and stores requests as sent, and says so in the log.
            The detectors are built in a background thread (seconds, once per process and policy); calls that
            arrive before then wait for them off the event loop.

    Without ``api_key`` the app serves only requests that arrived on a loopback interface, whichever
    ASGI server runs it (:class:`~agentforge.loopback.LoopbackGuard`).

    Returns:
        The FastAPI app; ``app.state.gateway.orphans`` counts orphan spans written.

    Raises:
        UserError: ``api_key`` is shorter than :data:`~agentforge.loopback.MIN_KEY_LENGTH` characters.
    """
    check_key(api_key, "gateway")
    gateway = _Gateway(store, router, transport, timeout_s, privacy)
    app = GatewayApp(
        title="agentforge gateway", lifespan=gateway.lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.gateway = gateway
    if tenants is not None or tenant_models is not None or tenant_header:
        gateway.tenants = GatewayTenants(router, tenant_models, trust_header=tenant_header)
        gateway.pins.loads_tenants = tenant_models is not None
        gateway.pins.own_lineage = tenant_models.serves_own if tenant_models is not None else None
    # the key check (or the loopback guard) first, then LLM calls skip FastAPI's stack
    dialects = {  # other APIs over the chat handler: gateway/anthropic.py, gateway/responses.py
        "messages": messages_route(gateway.handle),
        "responses": responses_route(gateway.handle),
    }

    async def llm_call(request: Request, route: LLMRoute) -> Response:
        if route == "messages" or route == "responses":
            return await dialects[route](request)
        return await gateway.handle(request, route)

    app.serve_llm_routes(llm_call, api_key, max_request_bytes, open_prefixes=tuple(mounts or ()))

    if tenants is not None and isinstance(app._entry, ApiKeyMiddleware):  # tenant keys pass the key check
        app._entry.tenants = tenants

    def handler(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            return await gateway.handle(request, endpoint)

        return route

    for prefix in ("", ROLLOUT_PATH_PREFIX + "{rollout_id}"):
        app.add_api_route(prefix + "/v1/chat/completions", handler("chat"), methods=["POST"])
        app.add_api_route(prefix + "/v1/completions", handler("completions"), methods=["POST"])
        for name, dialect in dialects.items():
            app.add_api_route(f"{prefix}/v1/{name}", dialect, methods=["POST"])
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
            app.add_middleware(BodyLimit)  # the store routes' limit (LLM calls have the fast path's)
            app.include_router(
                store_router(
                    store, api_key=api_key, admin_key=admin_key, adapter_root=adapter_root, tenants=tenants
                )
            )
    for prefix, mounted in (mounts or {}).items():  # before the catch-all, which would answer 404
        app.mount(prefix, mounted)
    app.add_api_route("/{path:path}", not_found, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    app.add_exception_handler(StarletteHTTPException, http_error)  # e.g. 405: OpenAI's shape too
    return app
