"""The store server: FastAPI routes under ``/api`` serving any ``TraceStore`` as JSON.

Used by :func:`create_store_app` (a store-only app) and by the gateway (``include_router`` of
:func:`store_router`, so one port serves both); its client is :class:`agentforge.stores.http.HTTPStore`.

Wire format: JSON bodies, **ASCII-escaped** both ways (``\\uXXXX``), so every string the store can hold
(lone surrogates included) and non-finite floats inside attributes cross the wire unchanged. Errors
come back as ``{"detail": {"error": <class name>, "message": str}}`` with status 404 (``NotFoundError``),
409 (``InvalidTransitionError``), 400 (other ``UserError``), 401 (bad API key), 403 (the store key, or
no admin key configured, on an admin route), 413 (a body over ``max_request_bytes``, 16 MiB by default) or
503 (``StoreError``); request bodies that do not validate get FastAPI's 422.

Two keys (:mod:`agentforge.stores.auth`): the store key for every route, and a distinct admin key for the
admin routes ``POST /api/resources`` and ``POST /api/resources/activate``, which also check adapter paths
against the server's adapter root and log every call (:mod:`agentforge.stores.admin`).

Routes: ``POST /api/rollouts``, ``GET /api/rollouts``, ``GET /api/rollouts/page`` (keyset pages), ``GET|PATCH /api/rollouts/{id}``,
``GET /api/rollouts/{id}/attempts``, ``POST /api/rollouts/claim``, ``POST /api/rollouts/requeue_stale``,
``POST /api/attempts/{id}/heartbeat``, ``POST /api/attempts/{id}/finish``, ``POST|GET /api/spans`` (beyond one
rollout, in keyset pages of at most :data:`SPAN_PAGE`; ``GET /api/rollouts`` in pages of at most :data:`ROLLOUT_PAGE`),
``POST /api/batch`` (spans and rewards in order, one transaction: see :func:`batch_results`),
``POST /api/rewards``, ``GET /api/rollouts/{id}/rewards`` (in pages of at most :data:`REWARD_PAGE`),
``GET /api/rollouts/{id}/final_reward``, ``POST|GET /api/resources`` (``GET`` in pages of at most
:data:`RESOURCE_PAGE`), ``GET /api/resources/version``, ``POST /api/resources/activate``,
``GET /api/store/metrics`` (the OTLP export's counters in Prometheus' text format, :func:`otlp_metrics_text`) and
the unauthenticated ``GET /api/store/health``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Body, Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import Response
from pydantic import ValidationError

from agentforge.bodylimit import BodyLimit
from agentforge.errors import InvalidTransitionError, NotFoundError, StoreError, UserError
from agentforge.loopback import LoopbackGuard
from agentforge.ports import TraceStore
from agentforge.queries import RolloutQuery
from agentforge.stores.admin import admin_router
from agentforge.stores.auth import check_keys, key_matches, presented_key
from agentforge.stores.tables import dumps
from agentforge.stores.tenant_scope import TenantForbidden, TenantView
from agentforge.stores.tenants import TenantDirectory
from agentforge.stores.wire import (
    MAX_BATCH,
    MAX_BODY_BYTES,
    NEXT_AFTER_RESOURCE,
    NEXT_AFTER_ROLLOUT,
    NEXT_AFTER_SEQUENCE,
    RESOURCE_PAGE,
    REWARD_PAGE,
    ROLLOUT_PAGE,
    SPAN_PAGE,
    BatchItem,
    BatchRequest,
    BatchResult,
    BatchResults,
    json_bytes,
    parse,
    patch_of,
    write_accepted,
)
from agentforge.types import AttemptState, Reward, Rollout, RolloutState, Span, SpanKind

__all__ = ["store_router", "create_store_app", "batch_results", "otlp_metrics_text"]


def otlp_metrics_text(store: TraceStore) -> str:
    """The counters of ``store``'s OTLP export (:meth:`agentforge.stores.otlp.OTLPExport.metrics`) in Prometheus'
    text format: ``agentforge_otlp_export_enabled`` (0 or 1), ``agentforge_otlp_spans_exported_total``,
    ``agentforge_otlp_dropped_total{reason="queue_full"|"export_failed"|"build_error"}`` and
    ``agentforge_otlp_queue_size``."""
    listener = getattr(store, "listener", None)
    counts = listener.metrics() if listener is not None and hasattr(listener, "metrics") else None
    lines = [
        "# TYPE agentforge_otlp_export_enabled gauge",
        f"agentforge_otlp_export_enabled {int(counts is not None)}",
    ]
    if counts is not None:
        lines += [
            "# TYPE agentforge_otlp_spans_exported_total counter",
            f"agentforge_otlp_spans_exported_total {counts['exported']}",
            "# TYPE agentforge_otlp_dropped_total counter",
            f'agentforge_otlp_dropped_total{{reason="queue_full"}} {counts["dropped_queue_full"]}',
            f'agentforge_otlp_dropped_total{{reason="export_failed"}} {counts["dropped_export_failed"]}',
            f'agentforge_otlp_dropped_total{{reason="build_error"}} {counts["build_errors"]}',
            "# TYPE agentforge_otlp_queue_size gauge",
            f"agentforge_otlp_queue_size {counts['queued']}",
        ]
    return "\n".join(lines) + "\n"


def batch_results(store: TraceStore, items: list[BatchItem | str], ack: str = "full") -> list[BatchResult]:
    """Write a batch through ``store.write_batch`` and shape one result per item.

    Args:
        store: the store to write to.
        items: the request's items; a string stands for an item that did not validate (its message): it
            fails alone, as ``ValidationError``, and the others are written.
        ack: ``"full"`` (the stored item) or ``"patch"`` (only what the store changed, when it can be said
            as a patch; see :mod:`agentforge.stores.wire`).

    Returns:
        A result holding the stored ``span``/``reward`` (or its ``patch``), or the ``error`` class name and
        ``message`` of an item the store rejected alone.

    Raises:
        StoreError: the batch failed as a whole.
    """
    entries: list[Span | Reward | str] = []  # an item, or the message that refused it
    for i, item in enumerate(items):
        if isinstance(item, str):
            entries.append(item)
        elif item.span is not None and item.reward is None:
            entries.append(item.span)
        elif item.reward is not None and item.span is None:
            entries.append(item.reward)
        else:
            entries.append(f"batch item {i} must hold exactly one of 'span' and 'reward'")
    out: list[BatchResult] = []
    for sent, result in zip(entries, write_accepted(store, entries), strict=True):
        if isinstance(result, str):
            out.append(BatchResult(error="ValidationError", message=result))
        elif isinstance(result, Exception):
            out.append(BatchResult(error=type(result).__name__, message=str(result)))
        elif ack == "patch" and not isinstance(sent, str) and (patch := patch_of(sent, result)) is not None:
            out.append(BatchResult(patch=patch))
        elif isinstance(result, Span):
            out.append(BatchResult(span=result))
        else:
            out.append(BatchResult(reward=result))
    return out


def _item_by_item(raw: bytes) -> tuple[list[BatchItem | str], str] | None:
    """A batch body whose envelope is valid but some items are not: each item validated alone (an invalid one
    becomes its error message); ``None`` when the envelope itself is wrong (then the whole request is a 422)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        return None
    ack = data.get("ack", "full")
    if ack not in ("full", "patch") or len(data["items"]) > MAX_BATCH:
        return None
    items: list[BatchItem | str] = []
    for i, item in enumerate(data["items"]):
        try:
            items.append(BatchItem.model_validate(item))
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
            where = ".".join(str(x) for x in first.get("loc", ()))
            items.append(f"batch item {i} is invalid: {where}: {first.get('msg', 'invalid')}"[:500])
    return items, ack


class _ASCIIJSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content).encode("ascii")


def _dump(obj: Any) -> Any:
    if isinstance(obj, list | tuple):
        return [_dump(o) for o in obj]
    return obj.model_dump() if hasattr(obj, "model_dump") else obj


def _checked(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a store method; its ``AgentForgeError`` becomes the ``HTTPException`` of the wire format."""
    try:
        return fn(*args, **kwargs)
    except NotFoundError as exc:
        status = 404
        error: Exception = exc
    except InvalidTransitionError as exc:
        status, error = 409, exc
    except TenantForbidden as exc:
        status, error = 403, exc
    except UserError as exc:
        status, error = 400, exc
    except StoreError as exc:
        status, error = 503, exc
    raise HTTPException(status, detail={"error": type(error).__name__, "message": str(error)})


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> _ASCIIJSONResponse:
    """Run a store method and turn its result or error into a response."""
    return _ASCIIJSONResponse(_dump(_checked(fn, *args, **kwargs)))


def store_router(
    store: TraceStore,
    api_key: str | None = None,
    *,
    admin_key: str | None = None,
    adapter_root: str | Path | None = None,
    tenants: TenantDirectory | None = None,
) -> APIRouter:
    """JSON routes under ``/api`` serving ``store`` (see the module docstring for the list).

    Args:
        store: any ``TraceStore`` (usually a :class:`~agentforge.stores.sql.SQLStore`).
        api_key: the store key: when set, every route but ``/api/store/health`` and the admin routes needs
            ``Authorization: Bearer <api_key>`` (scheme in any case) or ``X-Api-Key: <api_key>``.
        admin_key: the admin key the admin routes (publish/activate resources) need, distinct from
            ``api_key``; ``None`` closes them (403). See :mod:`agentforge.stores.admin`.
        adapter_root: the directory adapters may be published from (paths are checked to resolve inside
            it); ``None``: no resource naming an adapter path can be published or activated here.
        tenants: where tenant keys are looked up (e.g. ``TenantKeyCache(sql_store.tenant_keys)``): a request
            presenting a tenant key instead of ``api_key`` sees and writes only its tenant's rollouts, spans,
            rewards and lineages (:class:`~agentforge.stores.tenant_scope.TenantView`); ``None``: no tenant keys.

    Returns:
        A router to ``include_router`` into a FastAPI app. Route functions are synchronous, so FastAPI
        runs the blocking store calls in its thread pool.

    Raises:
        UserError: a key shorter than 16 characters, or ``admin_key == api_key``
            (:func:`agentforge.stores.auth.check_keys`).
    """

    check_keys(api_key, admin_key)
    root = None if adapter_root is None else Path(adapter_root)

    def check_key(
        authorization: str | None = Header(default=None), x_api_key: str | None = Header(default=None)
    ) -> str | None:
        """The tenant the caller's key acts for (``None``: the store key, or no key configured)."""
        given = presented_key(authorization, x_api_key)
        if tenants is not None and given is not None and not (api_key and key_matches(given, api_key)):
            tenant = tenants.tenant_of_key(given)
            if tenant is not None:
                return tenant
        if api_key is None or key_matches(given, api_key):
            return None
        raise HTTPException(401, detail={"error": "UserError", "message": "missing or wrong store API key"})

    def scoped(tenant: str | None = Depends(check_key)) -> Any:
        """The store as the caller may see it: whole, or one tenant's view."""
        return store if tenant is None else TenantView(store, tenant)

    r = APIRouter(dependencies=[Depends(check_key)])
    open_r = APIRouter(prefix="/api")

    @open_r.get("/store/health")
    def health() -> dict[str, bool]:
        return {"ok": True}

    @r.get("/store/metrics")
    def metrics() -> Response:
        return Response(otlp_metrics_text(store), media_type="text/plain; version=0.0.4")

    @r.post("/rollouts")
    def enqueue(rollout: Rollout, st: Any = Depends(scoped)) -> Response:
        return _call(st.enqueue_rollout, rollout)

    @r.get("/rollouts")
    def list_rollouts(
        state: RolloutState | None = None,
        group_id: str | None = None,
        agent: str | None = None,
        since: float | None = None,
        limit: Annotated[int | None, Query(ge=1)] = None,
        tenant: str | None = None,
        after: str | None = None,
        st: Any = Depends(scoped),
    ) -> Response:
        """Rollouts oldest first, in pages of at most :data:`ROLLOUT_PAGE`; a full page names the next page's
        ``after`` (its last rollout id) in the ``X-Next-After-Rollout`` header."""
        cap = min(limit or ROLLOUT_PAGE, ROLLOUT_PAGE)
        rows = _checked(
            st.list_rollouts,
            state=state,
            group_id=group_id,
            agent=agent,
            since=since,
            limit=cap,
            tenant=tenant,
            after=after,
        )
        return _page(rows, cap, NEXT_AFTER_ROLLOUT, lambda last: last.rollout_id)

    @r.post("/rollouts/claim")
    def claim(
        worker_id: str = Body(),
        agent: str | None = Body(default=None),
        attempt_id: str | None = Body(default=None),
        st: Any = Depends(scoped),
    ) -> Response:
        def fn() -> Any:
            got = st.claim_rollout(worker_id, agent=agent, attempt_id=attempt_id)
            return None if got is None else {"rollout": got[0].model_dump(), "attempt": got[1].model_dump()}

        return _call(fn)

    @r.post("/rollouts/requeue_stale")
    def requeue_stale(heartbeat_timeout_s: float = Body(embed=True), st: Any = Depends(scoped)) -> Response:
        return _call(st.requeue_stale, heartbeat_timeout_s)

    @r.get("/rollouts/page")  # before /rollouts/{rollout_id}, which would take "page" for an id
    def page_rollouts(query: Annotated[RolloutQuery, Query()], st: Any = Depends(scoped)) -> Response:
        return _call(st.page_rollouts, query)

    @r.get("/rollouts/{rollout_id}")
    def get_rollout(rollout_id: str, st: Any = Depends(scoped)) -> Response:
        return _call(st.get_rollout, rollout_id)

    @r.patch("/rollouts/{rollout_id}")
    def update_rollout(
        rollout_id: str, fields: dict[str, Any] = Body(), st: Any = Depends(scoped)
    ) -> Response:
        return _call(st.update_rollout, rollout_id, **fields)

    @r.get("/rollouts/{rollout_id}/attempts")
    def list_attempts(rollout_id: str, st: Any = Depends(scoped)) -> Response:
        return _call(st.list_attempts, rollout_id)

    @r.post("/attempts/{attempt_id}/heartbeat")
    def heartbeat(attempt_id: str, st: Any = Depends(scoped)) -> Response:
        return _call(st.heartbeat, attempt_id)

    @r.post("/attempts/{attempt_id}/finish")
    def finish(
        attempt_id: str,
        state: AttemptState = Body(),
        error: str | None = Body(default=None),
        st: Any = Depends(scoped),
    ) -> Response:
        return _call(st.finish_attempt, attempt_id, state, error)

    @r.post("/spans")
    def add_span(span: Span, st: Any = Depends(scoped)) -> Response:
        return _call(st.add_span, span)

    @r.post("/batch")
    async def write_batch(request: Request, st: Any = Depends(scoped)) -> Response:
        raw = await request.body()
        items: list[BatchItem | str]
        try:
            batch = parse(BatchRequest, raw)
            items = list(batch.items)
            ack = batch.ack
        except ValueError as exc:  # pydantic's ValidationError is a ValueError too
            if not isinstance(exc, ValidationError):
                raise HTTPException(422, detail=[{"type": "json_invalid", "msg": str(exc)}]) from None
            salvaged = _item_by_item(raw)  # one bad item fails alone, not the batch of 100 around it
            if salvaged is None:
                errors = exc.errors(include_url=False, include_context=False, include_input=False)
                raise HTTPException(422, detail=errors) from None
            items, ack = salvaged

        def write() -> Response:  # blocking: in a worker thread, like the synchronous routes
            results = BatchResults(results=_checked(batch_results, st, items, ack))
            return Response(json_bytes(results), media_type="application/json")

        return await anyio.to_thread.run_sync(write)

    @r.get("/spans")
    def list_spans(
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        kind: SpanKind | None = None,
        orphans: bool = False,
        valid_only: bool = False,
        tenant: str | None = None,
        after_sequence: int | None = None,
        limit: Annotated[int | None, Query(ge=1)] = None,
        st: Any = Depends(scoped),
    ) -> Response:
        """Spans in pages of at most :data:`SPAN_PAGE` rows of the sequence order (one rollout's or attempt's
        too: a rollout's agent may write any number), the next page's ``after_sequence`` in the
        ``X-Next-After-Sequence`` header."""
        listed = functools.partial(st.list_spans, rollout_id, attempt_id, kind, orphans, tenant=tenant)
        cap = min(limit or SPAN_PAGE, SPAN_PAGE)
        rows = _checked(listed, False, after_sequence=after_sequence, limit=cap)
        spans = _checked(listed, True, after_sequence=after_sequence, limit=cap) if valid_only else rows
        answer = _ASCIIJSONResponse(_dump(spans))
        if len(rows) == cap:  # a full page: more may follow (valid_only may have left rows of it out)
            answer.headers[NEXT_AFTER_SEQUENCE] = str(rows[-1].sequence)
        return answer

    @r.post("/rewards")
    def add_reward(reward: Reward, st: Any = Depends(scoped)) -> Response:
        return _call(st.add_reward, reward)

    @r.get("/rollouts/{rollout_id}/rewards")
    def list_rewards(
        rollout_id: str,
        after_sequence: int | None = None,
        limit: Annotated[int | None, Query(ge=1)] = None,
        st: Any = Depends(scoped),
    ) -> Response:
        """A rollout's rewards in pages of at most :data:`REWARD_PAGE` (anyone holding the rollout's URL may
        post any number), the next page's ``after_sequence`` in the ``X-Next-After-Sequence`` header."""
        cap = min(limit or REWARD_PAGE, REWARD_PAGE)
        rows = _checked(st.list_rewards, rollout_id, after_sequence=after_sequence, limit=cap)
        return _page(rows, cap, NEXT_AFTER_SEQUENCE, lambda last: str(last.sequence))

    @r.get("/rollouts/{rollout_id}/final_reward")
    def final_reward(rollout_id: str, st: Any = Depends(scoped)) -> Response:
        return _call(st.final_reward, rollout_id)

    @r.get("/resources")
    def list_resources(
        name: str | None = None,
        after: str | None = None,
        limit: Annotated[int | None, Query(ge=1)] = None,
        st: Any = Depends(scoped),
    ) -> Response:
        """Resource versions by name then version, in pages of at most :data:`RESOURCE_PAGE`; a full page names
        the next page's ``after`` (``[name, version]`` as JSON) in the ``X-Next-After-Resource`` header."""
        cap = min(limit or RESOURCE_PAGE, RESOURCE_PAGE)
        rows = _checked(st.list_resources, name, after=_resource_cursor(after), limit=cap)
        return _page(rows, cap, NEXT_AFTER_RESOURCE, lambda last: json.dumps([last.name, last.version]))

    @r.get("/resources/version")
    def get_resource(name: str, version: int | None = None, st: Any = Depends(scoped)) -> Response:
        return _call(st.get_resource, name, version)

    open_r.include_router(r)
    open_r.include_router(
        admin_router(store, api_key=api_key, admin_key=admin_key, adapter_root=root, call=_call)
    )
    return open_r


def _page(rows: list[Any], cap: int, header: str, cursor: Callable[[Any], str]) -> Response:
    """``rows`` as an ASCII JSON answer; a full page (``cap`` rows: more may follow) names the next page's
    start, ``cursor(rows[-1])``, in the response header ``header``."""
    answer = _ASCIIJSONResponse(_dump(rows))
    if len(rows) == cap:
        answer.headers[header] = cursor(rows[-1])
    return answer


def _resource_cursor(after: str | None) -> tuple[str, int] | None:
    """``GET /api/resources``'s ``after``: ``[name, version]`` as JSON → ``(name, version)``.

    Raises:
        HTTPException: 400 when it is not such a pair.
    """
    if after is None:
        return None
    try:
        name, version = json.loads(after)
    except (ValueError, TypeError):
        name = version = None
    if not isinstance(name, str) or type(version) is not int:
        raise HTTPException(
            400, detail={"error": "UserError", "message": "after must be [name, version] as JSON"}
        )
    return name, version


def create_store_app(
    store: TraceStore,
    api_key: str | None = None,
    *,
    admin_key: str | None = None,
    adapter_root: str | Path | None = None,
    tenants: TenantDirectory | None = None,
    max_request_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """A FastAPI app serving only :func:`store_router` (run it with uvicorn, on any interface; a process
    that serves it should call :func:`agentforge.config.serving_gc` once it has started).

    The bind rule lives here, where the app is built, not only in a server wrapper: without ``api_key``
    the app answers only requests that arrived on a loopback interface; any other request gets a 403 with
    the fix, whatever host the ASGI server was told to bind (:class:`~agentforge.loopback.LoopbackGuard`).
    The app serves no ``/docs``, ``/redoc`` or ``/openapi.json``.


    Args:
        store, api_key, admin_key, adapter_root, tenants: as for :func:`store_router`.
        max_request_bytes: the largest request body taken (bytes); a larger one is a 413 that never reaches a
            route (:class:`~agentforge.bodylimit.BodyLimit`). :class:`HTTPStore` splits its batches below it.

    Returns:
        The app.

    Raises:
        UserError: as :func:`store_router` (weak or shared keys).
    """
    app = FastAPI(title="agentforge trace store", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(
        store_router(store, api_key=api_key, admin_key=admin_key, adapter_root=adapter_root, tenants=tenants)
    )
    app.add_middleware(BodyLimit, limit=max_request_bytes)
    if api_key is None:
        app.add_middleware(LoopbackGuard, what="store server")
    return app
