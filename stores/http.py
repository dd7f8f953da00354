"""``HTTPStore``: the ``TraceStore`` client of a store server, for runners and apps in other processes
or on other machines.

.. code-block:: python

    app = create_store_app(SQLStore("postgresql+psycopg://..."), api_key="secret")  # run with uvicorn
    store = HTTPStore("http://host:8000", api_key="secret")  # a TraceStore like any other

The server side (routes, wire format, status codes) is :mod:`agentforge.stores.server`. Spans and
rewards go through a group-commit writer (:mod:`agentforge.stores.writer`): concurrent ``add_span`` /
``add_reward`` calls of one client share ``POST /api/batch`` requests, each caller acknowledged once the
server committed its batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, TypeVar, cast
from urllib.parse import quote

import httpx
from pydantic import BaseModel
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from agentforge.errors import AgentForgeError, InvalidTransitionError, NotFoundError, StoreError, UserError
from agentforge.queries import RolloutPage, RolloutQuery
from agentforge.stores.codec import stamped
from agentforge.stores.tables import dumps
from agentforge.stores.wire import (
    BATCH_BYTES,
    MAX_BATCH,
    MAX_BODY_BYTES,
    NEXT_AFTER_RESOURCE,
    NEXT_AFTER_ROLLOUT,
    NEXT_AFTER_SEQUENCE,
    BatchResults,
    Encoded,
    batch_body,
    encode_item,
    parse,
)
from agentforge.stores.writer import GroupCommitWriter
from agentforge.types import (
    Attempt,
    AttemptState,
    ResourceVersion,
    Reward,
    Rollout,
    RolloutState,
    Span,
    SpanKind,
    new_id,
)

__all__ = ["HTTPStore"]

logger = logging.getLogger("agentforge.stores")

#: a record type of the store API (a page of a listing holds these)
M = TypeVar("M", bound=BaseModel)


class _Unavailable(Exception):
    """A 503 answer to a request safe to repeat: retried, then returned as the answer."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


_ERRORS: dict[str, type[Exception]] = {
    "NotFoundError": NotFoundError,
    "InvalidTransitionError": InvalidTransitionError,
    "StoreError": StoreError,
}


def _patched(
    items: Sequence[Span | Reward], answer: bytes, keep: Sequence[bool]
) -> list[Span | Reward | AgentForgeError | None] | None:
    """The usual answer of a batch (every item acknowledged with a patch of plain sequence numbers and
    ids) applied without validating each result: copies of the sent items with the patched fields set
    (``None`` for an item whose caller keeps no copy). ``None`` for anything else (errors, whole items,
    other fields): then every result is validated."""
    try:
        results = json.loads(answer)["results"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(results, list) or len(results) != len(items):
        return None
    out: list[Span | Reward | AgentForgeError | None] = []
    for sent, result, kept in zip(items, results, keep, strict=True):
        patch = result.get("patch") if isinstance(result, dict) else None
        if (
            not isinstance(patch, dict)
            or result.get("error") is not None
            or not patch.keys() <= _PLAIN_PATCH.keys()
        ):
            return None
        if not all(v is None or type(v) is _PLAIN_PATCH[k] for k, v in patch.items()):
            return None
        out.append(stamped(sent, patch) if kept else None)
    return out


#: Patch fields applied without validation, with the one type each may have (else: the validated path).
_PLAIN_PATCH: dict[str, type] = {"sequence": int, "rollout_id": str, "attempt_id": str, "span_id": str}


class HTTPStore:
    """A ``TraceStore`` client for a store server (:func:`create_store_app` or the gateway).

    Args:
        base_url: the server root, e.g. ``http://127.0.0.1:8000`` (routes are under ``/api``).
        api_key: the store key, sent as ``Authorization: Bearer <api_key>``.
        admin_key: the admin key, sent instead of ``api_key`` by :meth:`publish_resource` and
            :meth:`activate_resource` (the server's admin routes refuse the store key; see
            :mod:`agentforge.stores.admin`).
        timeout_s: per-request timeout, seconds.
        retries: extra tries after a connection error or a 503 (the server's database unavailable), with
            exponential backoff and jitter (tenacity). Only requests safe to repeat once the server may have
            seen them are retried after a 503 or a broken connection: everything except
            ``publish_resource`` (a version has no id of its own), which is retried only when the connection could
            not be opened. A claim carries the id of the attempt it opens, so a retried claim claims once.
        backoff_s: the scale of the waits between tries, seconds: try ``n`` waits a random time up to
            ``backoff_s * 2**n``, at most ``max_backoff_s`` (exponential backoff with full jitter).
        retry_for_s: stop retrying once this many seconds passed since the first try (``None``: only
            ``retries`` bounds it). Runners that must ride out a store server or database restart set
            ``retries`` high and this to the longest outage to hide, e.g. 120.
        max_backoff_s: the longest wait between two tries, seconds.
        transport: an ``httpx`` transport (tests: ``httpx.MockTransport``).

    Raises (from every method):
        NotFoundError, InvalidTransitionError, UserError: as the server's store raised them.
        StoreError: the server failed, or could not be reached after the retries (message has the URL).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        admin_key: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        retry_for_s: float | None = None,
        max_backoff_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries, self.backoff_s = retries, backoff_s
        self.retry_for_s, self.max_backoff_s = retry_for_s, max_backoff_s
        self._admin_headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else None
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport
        )
        self._writer: GroupCommitWriter[Span | Reward | Encoded, Span | Reward] = GroupCommitWriter(
            self.write_batch, "agentforge-writer-http", max_batch=256
        )

    def __repr__(self) -> str:
        return f"HTTPStore({self.base_url!r})"

    def __enter__(self) -> HTTPStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        safe: bool = True,
        content: bytes | None = None,
        raw: bool = False,
        headers: dict[str, str] | None = None,
        response: bool = False,
    ) -> Any:
        if content is None and body is not None:
            content = dumps(body).encode("ascii")
        params = {k: v for k, v in (params or {}).items() if v is not None}
        url = f"{self.base_url}{path}"

        def send() -> httpx.Response:
            resp = self._client.request(method, path, content=content, params=params, headers=headers)
            if resp.status_code == 503 and safe:
                raise _Unavailable(resp)
            return resp

        def repeatable(exc: BaseException) -> bool:
            if isinstance(exc, _Unavailable):
                return True
            connect = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            return isinstance(exc, httpx.TransportError) and (safe or connect)

        stop = stop_after_attempt(self.retries + 1)
        if self.retry_for_s is not None:
            stop = stop | stop_after_delay(self.retry_for_s)
        retrying = Retrying(
            stop=stop,
            wait=wait_random_exponential(multiplier=self.backoff_s, max=self.max_backoff_s),
            retry=retry_if_exception(repeatable),
            before_sleep=lambda state: logger.debug(
                "store server %s: try %d failed", url, state.attempt_number
            ),
            reraise=True,
        )
        try:
            resp = retrying(send)
        except _Unavailable as exc:
            resp = exc.response
        except httpx.TransportError as exc:
            tries = retrying.statistics.get("attempt_number", 1)
            raise StoreError(
                f"store server {url} unreachable after {tries} tries: {type(exc).__name__}: {exc}"
            ) from exc
        if resp.status_code >= 400:
            raise self._error(resp, method, url)
        return resp if response else resp.content if raw else json.loads(resp.content)

    @staticmethod
    def _error(resp: httpx.Response, method: str, url: str) -> Exception:
        try:
            detail = resp.json().get("detail")
        except ValueError:
            detail = None
        if isinstance(detail, dict) and "message" in detail:
            name, message = str(detail.get("error")), str(detail["message"])
        else:
            name, message = "", f"{method} {url} → HTTP {resp.status_code}: {detail or resp.text[:500]}"
        if resp.status_code in (401, 403):
            which = "admin_key" if "/api/resources" in url and method == "POST" else "api_key"
            return UserError(
                f"store server {url} rejected the request ({message}); check HTTPStore({which}=...)"
            )
        cls = _ERRORS.get(name)
        if cls is None:
            cls = StoreError if resp.status_code >= 500 else UserError
        if cls is StoreError:
            message = f"store server {url}: {message}"
        return cls(message)

    # --- rollouts ---------------------------------------------------------------------------------
    def enqueue_rollout(self, rollout: Rollout) -> Rollout:
        """See :meth:`TraceStore.enqueue_rollout`."""
        return Rollout.model_validate(self._request("POST", "/api/rollouts", rollout.model_dump()))

    def get_rollout(self, rollout_id: str) -> Rollout:
        """See :meth:`TraceStore.get_rollout`."""
        return Rollout.model_validate(self._request("GET", f"/api/rollouts/{_q(rollout_id)}"))

    def list_rollouts(
        self,
        state: RolloutState | None = None,
        group_id: str | None = None,
        agent: str | None = None,
        since: float | None = None,
        limit: int | None = None,
        *,
        tenant: str | None = None,
        after: str | None = None,
    ) -> list[Rollout]:
        """See :meth:`TraceStore.list_rollouts` (a tenant key's server lists only its tenant's rollouts). The
        server answers in pages (``ROLLOUT_PAGE``): without ``limit`` this reads them all, one request a page."""
        params = {"state": state, "group_id": group_id, "agent": agent, "since": since, "limit": limit}
        if tenant is not None:
            params["tenant"] = tenant
        return self._pages("/api/rollouts", params, ("after", after, NEXT_AFTER_ROLLOUT), Rollout, limit)

    def page_rollouts(self, query: RolloutQuery) -> RolloutPage:
        """See :meth:`TraceStore.page_rollouts` (``GET /api/rollouts/page``, the query as parameters)."""
        params = query.model_dump(mode="json", exclude_none=True)
        return RolloutPage.model_validate(self._request("GET", "/api/rollouts/page", params=params))

    def claim_rollout(
        self, worker_id: str, agent: str | None = None, *, attempt_id: str | None = None
    ) -> tuple[Rollout, Attempt] | None:
        """See :meth:`TraceStore.claim_rollout`. The attempt id is made here, so a claim whose answer was lost
        is retried like any other request and returns the same attempt (no second claim)."""
        body = {"worker_id": worker_id, "agent": agent, "attempt_id": attempt_id or new_id("at")}
        data = self._request("POST", "/api/rollouts/claim", body)
        if data is None:
            return None
        return Rollout.model_validate(data["rollout"]), Attempt.model_validate(data["attempt"])

    def heartbeat(self, attempt_id: str) -> None:
        """See :meth:`TraceStore.heartbeat`."""
        self._request("POST", f"/api/attempts/{_q(attempt_id)}/heartbeat")

    def finish_attempt(self, attempt_id: str, state: AttemptState, error: str | None = None) -> Rollout:
        """See :meth:`TraceStore.finish_attempt`."""
        body = {"state": AttemptState(state).value, "error": error}
        return Rollout.model_validate(self._request("POST", f"/api/attempts/{_q(attempt_id)}/finish", body))

    def requeue_stale(self, heartbeat_timeout_s: float) -> list[str]:
        """See :meth:`TraceStore.requeue_stale`."""
        return list(
            self._request("POST", "/api/rollouts/requeue_stale", {"heartbeat_timeout_s": heartbeat_timeout_s})
        )

    def update_rollout(self, rollout_id: str, **fields: Any) -> Rollout:
        """See :meth:`TraceStore.update_rollout`."""
        return Rollout.model_validate(self._request("PATCH", f"/api/rollouts/{_q(rollout_id)}", fields))

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        """See :meth:`TraceStore.list_attempts`."""
        return [
            Attempt.model_validate(d)
            for d in self._request("GET", f"/api/rollouts/{_q(rollout_id)}/attempts")
        ]

    # --- spans and rewards ------------------------------------------------------------------------
    def write_batch(self, items: Sequence[Span | Reward | Encoded]) -> list[Span | Reward | AgentForgeError]:
        """See :meth:`TraceStore.write_batch` (``POST /api/batch``; safe to retry: ids are idempotent; items
        :meth:`submit_many` encoded already are sent as they are). Items go in requests of at most
        :data:`MAX_BATCH` items and about :data:`BATCH_BYTES` bytes; an item whose own encoding is over the
        server's :data:`MAX_BODY_BYTES` fails alone with a ``UserError``, unsent."""
        encoded = [i if isinstance(i, Encoded) else Encoded(i, encode_item(i)) for i in items]
        out: list[Span | Reward | AgentForgeError | None] = []
        chunk: list[Encoded] = []
        size = 0

        def flush() -> None:
            nonlocal size
            if chunk:
                out.extend(self._write_chunk(chunk))
                chunk.clear()
                size = 0

        for item in encoded:
            if len(item.json) > MAX_BODY_BYTES - 64:
                flush()
                what = "span" if isinstance(item.item, Span) else "reward"
                limit = f"over the store server's limit of {MAX_BODY_BYTES} bytes a request"
                out.append(UserError(f"{what} is {len(item.json)} bytes encoded, {limit}"))
                continue
            if len(chunk) == MAX_BATCH or (chunk and size + len(item.json) > BATCH_BYTES):
                flush()
            chunk.append(item)
            size += len(item.json) + 1
        flush()
        # None only for an item encoded with keep=False (submit_many(stored=False)); never for a Span or Reward
        return cast("list[Span | Reward | AgentForgeError]", out)

    def _write_chunk(self, chunk: Sequence[Encoded]) -> list[Span | Reward | AgentForgeError | None]:
        body = batch_body([i.json for i in chunk])
        items = [i.item for i in chunk]
        keep = [i.keep for i in chunk]
        answer = self._request("POST", "/api/batch", content=body, raw=True)
        patched = _patched(items, answer, keep)
        if patched is not None:
            return patched
        out: list[Span | Reward | AgentForgeError | None] = []
        for sent, result, kept in zip(items, parse(BatchResults, answer).results, keep, strict=True):
            if result.patch is not None:  # what the store set on the item we sent
                out.append(sent.model_copy(update=result.patch) if kept else None)
            elif result.span is not None:
                out.append(result.span)
            elif result.reward is not None:
                out.append(result.reward)
            else:
                cls = _ERRORS.get(result.error or "", UserError)
                out.append(cls(str(result.message)))  # type: ignore[arg-type]
        return out

    def submit(self, item: Span | Reward) -> Future[Span | Reward]:
        """See :meth:`TraceStore.submit`."""
        return self._writer.submit(item)

    def submit_many(
        self, items: Sequence[Span | Reward], *, stored: bool = True
    ) -> Future[list[Span | Reward | BaseException | None]]:
        """:meth:`SQLStore.submit_many <agentforge.stores.sql.SQLStore.submit_many>` over HTTP: the items
        share ``POST /api/batch`` requests (each encoded here, in the caller's thread, while the writer thread
        waits on earlier requests); the future resolves once the server committed all of them. ``stored=False``:
        a newly written item's outcome is ``None`` (no stored copy is built from the server's answer)."""
        future = self._writer.submit_many([Encoded(i, encode_item(i), stored) for i in items])
        return cast("Future[list[Span | Reward | BaseException | None]]", future)  # None: stored=False

    def submit_async(self, item: Span | Reward) -> asyncio.Future[Span | Reward]:
        """See :meth:`TraceStore.submit_async`."""
        return self._writer.submit_async(item)

    def add_span(self, span: Span) -> Span:
        """See :meth:`TraceStore.add_span` (batched with concurrent calls of this client)."""
        return self._writer.write(span)  # type: ignore[return-value]

    def list_spans(
        self,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        kind: SpanKind | None = None,
        orphans: bool = False,
        valid_only: bool = False,
        *,
        tenant: str | None = None,
        after_sequence: int | None = None,
        limit: int | None = None,
    ) -> list[Span]:
        """See :meth:`TraceStore.list_spans`. Beyond one rollout the server answers in pages (``SPAN_PAGE``):
        without ``limit`` this reads them all, one request a page."""
        params: dict[str, Any] = {
            "rollout_id": rollout_id,
            "attempt_id": attempt_id,
            "kind": None if kind is None else SpanKind(kind).value,
            "orphans": orphans,
            "valid_only": valid_only,
            "limit": limit,
        }
        if tenant is not None:
            params["tenant"] = tenant
        cursor = ("after_sequence", after_sequence, NEXT_AFTER_SEQUENCE)
        return self._pages("/api/spans", params, cursor, Span, limit)

    def _pages(
        self,
        path: str,
        params: dict[str, Any],
        cursor: tuple[str, Any, str],
        model: type[M],
        limit: int | None,
    ) -> list[M]:
        """Every page of the keyset-paged listing ``GET path`` (at most ``limit`` items): ``cursor`` is ``(query
        parameter, its first value, response header naming the next page's value)``; a page without the header
        is the last."""
        name, value, header = cursor
        items: list[M] = []
        while True:
            resp = self._request("GET", path, params={**params, name: value}, response=True)
            items += [model.model_validate(d) for d in json.loads(resp.content)]
            value = resp.headers.get(header)
            if value is None or (limit is not None and len(items) >= limit):
                return items if limit is None else items[:limit]

    def add_reward(self, reward: Reward) -> Reward:
        """See :meth:`TraceStore.add_reward` (batched with concurrent calls of this client)."""
        return self._writer.write(reward)  # type: ignore[return-value]

    def list_rewards(
        self, rollout_id: str, *, after_sequence: int | None = None, limit: int | None = None
    ) -> list[Reward]:
        """See :meth:`TraceStore.list_rewards`; reads every page the server answers in (``REWARD_PAGE``)."""
        cursor = ("after_sequence", after_sequence, NEXT_AFTER_SEQUENCE)
        path = f"/api/rollouts/{_q(rollout_id)}/rewards"
        return self._pages(path, {"limit": limit}, cursor, Reward, limit)

    def final_reward(self, rollout_id: str) -> Reward | None:
        """See :meth:`TraceStore.final_reward`."""
        data = self._request("GET", f"/api/rollouts/{_q(rollout_id)}/final_reward")
        return None if data is None else Reward.model_validate(data)

    # --- versioned resources ----------------------------------------------------------------------
    def publish_resource(self, resource: ResourceVersion, activate: bool = True) -> ResourceVersion:
        """See :meth:`TraceStore.publish_resource`."""
        data = self._request(
            "POST",
            "/api/resources",
            resource.model_dump(),
            {"activate": activate},
            safe=False,
            headers=self._admin_headers,
        )
        return ResourceVersion.model_validate(data)

    def get_resource(self, name: str, version: int | None = None) -> ResourceVersion:
        """See :meth:`TraceStore.get_resource`."""
        data = self._request("GET", "/api/resources/version", params={"name": name, "version": version})
        return ResourceVersion.model_validate(data)

    def activate_resource(self, name: str, version: int) -> ResourceVersion:
        """See :meth:`TraceStore.activate_resource`."""
        body = {"name": name, "version": version}
        data = self._request("POST", "/api/resources/activate", body, headers=self._admin_headers)
        return ResourceVersion.model_validate(data)

    def list_resources(
        self, name: str | None = None, *, after: tuple[str, int] | None = None, limit: int | None = None
    ) -> Sequence[ResourceVersion]:
        """See :meth:`TraceStore.list_resources`; reads every page the server answers in (``RESOURCE_PAGE``)."""
        cursor = ("after", None if after is None else json.dumps(list(after)), NEXT_AFTER_RESOURCE)
        return self._pages("/api/resources", {"name": name, "limit": limit}, cursor, ResourceVersion, limit)

    def close(self) -> None:
        """Send what is queued, then close the HTTP connection pool. Safe to call twice."""
        self._writer.close()
        self._client.close()


def _q(identifier: str) -> str:
    return quote(identifier, safe="")
