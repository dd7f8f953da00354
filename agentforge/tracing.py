"""Rewards and custom spans from agent code: ``emit_reward`` and ``emit_span``.

LLM calls are traced by the gateway; these two functions are for what only the agent knows (a score,
a retrieval step, user feedback). Three ways to say where they go:

* **In process** (the runner does this around each rollout): inside ``with rollout_context(store,
  rollout_id, attempt_id):`` plain ``emit_reward(1.0)`` writes to that store for that rollout. The
  context lives in a :mod:`contextvars` variable, so it follows the code into asyncio tasks and into
  threads started through ``contextvars.copy_context().run`` (e.g. ``loop.run_in_executor`` or
  LangGraph's executor), and two rollouts running concurrently never see each other's context.
* **Explicit store**: ``emit_reward(1.0, rollout_id=..., store=my_store)``.
* **Over HTTP** from another process (an app's feedback button, hours later):
  ``emit_reward(1.0, rollout_id=..., url="http://host:port")`` posts to the store server
  (:func:`agentforge.stores.http.store_router`, also mounted by the gateway).

Which reward trains is decided by the store's attachment rule (see :class:`agentforge.types.Reward`).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from agentforge.errors import UserError
from agentforge.types import Reward, Span, SpanKind, now

if TYPE_CHECKING:
    from agentforge.ports import TraceStore

__all__ = ["TraceContext", "rollout_context", "current_context", "emit_reward", "emit_span"]


@dataclass(frozen=True)
class TraceContext:
    """Where ``emit_*`` writes: the store and the rollout (and attempt) to record into.

    The runner hands agents the richer :class:`agentforge.runtime.RolloutContext` (a subclass that adds the
    gateway URL, pinned versions and OpenAI clients); this base is what :func:`rollout_context` sets.
    """

    store: TraceStore
    rollout_id: str
    attempt_id: str | None = None


_CURRENT: contextvars.ContextVar[TraceContext | None] = contextvars.ContextVar(
    "agentforge_rollout_context", default=None
)


class rollout_context:  # noqa: N801 - used like a function: ``with rollout_context(...)``
    """Make ``(store, rollout_id, attempt_id)`` the current context for ``emit_*`` calls.

    Usable as ``with`` and ``async with``; contexts nest (the inner one wins until it exits).

    Args:
        store: the store to write to (any ``TraceStore``).
        rollout_id: the rollout the agent is running.
        attempt_id: the attempt, when known (the runner knows it; the store otherwise stamps the
            rollout's running attempt).
    """

    def __init__(self, store: TraceStore, rollout_id: str, attempt_id: str | None = None) -> None:
        if not rollout_id:
            raise UserError("rollout_context() needs a rollout_id")
        self.context = TraceContext(store, rollout_id, attempt_id)
        self._tokens: list[contextvars.Token[TraceContext | None]] = []

    def __enter__(self) -> TraceContext:
        self._tokens.append(_CURRENT.set(self.context))
        return self.context

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._tokens.pop())

    async def __aenter__(self) -> TraceContext:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def current_context() -> TraceContext | None:
    """The active :class:`TraceContext`, or ``None`` outside any."""
    return _CURRENT.get()


def _target(
    what: str,
    rollout_id: str | None,
    attempt_id: str | None,
    store: TraceStore | None,
    url: str | None,
    api_key: str | None,
) -> tuple[TraceStore, str, str | None, bool]:
    """Resolve ``(store, rollout_id, attempt_id, owned)``; ``owned``: a client we must close."""
    ctx = _CURRENT.get()
    if store is not None and url is not None:
        raise UserError(f"{what}(): pass either store= or url=, not both")
    if rollout_id is None:
        if ctx is None:
            raise UserError(
                f"{what}() was called outside a rollout: no rollout context is active. Pass "
                f"rollout_id= together with store= (a TraceStore) or url= (the store server, e.g. "
                f"'http://127.0.0.1:8000'), or call it inside `with agentforge.tracing.rollout_context("
                f"store, rollout_id):` (the runner does this for you)."
            )
        rollout_id = ctx.rollout_id
    if attempt_id is None and ctx is not None and ctx.rollout_id == rollout_id:
        attempt_id = ctx.attempt_id
    if url is not None:
        from agentforge.open import open_store

        return open_store(url, api_key=api_key), rollout_id, attempt_id, True
    if store is None:
        if ctx is None:
            raise UserError(
                f"{what}(rollout_id={rollout_id!r}) has nowhere to write: pass store= (a TraceStore) or "
                f"url= (the store server), or call it inside agentforge.tracing.rollout_context(store, ...)"
            )
        store = ctx.store
    return store, rollout_id, attempt_id, False


def emit_reward(
    value: float | None,
    name: str = "reward",
    final: bool = False,
    *,
    rollout_id: str | None = None,
    attempt_id: str | None = None,
    span_id: str | None = None,
    source: str = "agent",
    store: TraceStore | None = None,
    url: str | None = None,
    api_key: str | None = None,
    **metadata: Any,
) -> Reward:
    """Record a reward for the current (or given) rollout.

    Args:
        value: the reward (any float; ``None`` or NaN is stored as an *invalid* reward, never as 0).
        name: what the reward measures, e.g. ``"correct"``, ``"user_thumbs"``.
        final: this reward is the rollout's training reward, whatever comes after it (unless another
            final reward follows).
        rollout_id: defaults to the current context's rollout.
        attempt_id: defaults to the context's attempt for the same rollout.
        span_id: the span it scores; by default the rollout's latest span recorded before it.
        source: who emitted it (``"agent"``, ``"user"``, ``"judge"``...).
        store: write here instead of the context's store.
        url: write to the store server at this base URL (another process or machine).
        api_key: the store server's API key (with ``url``).
        **metadata: stored with the reward (JSON-serialisable values).

    Returns:
        The stored reward (with ``sequence``, ``span_id`` and ``attempt_id`` filled in by the store).

    Raises:
        UserError: no context and no ``rollout_id``/``store``/``url`` (the message says what to pass).
        NotFoundError: unknown rollout, attempt or span.
        StoreError: the store (or server) failed after its retries.
    """
    target, rid, aid, owned = _target("emit_reward", rollout_id, attempt_id, store, url, api_key)
    reward = Reward(
        rollout_id=rid,
        attempt_id=aid,
        span_id=span_id,
        name=name,
        value=value,
        final=final,
        source=source,
        metadata=metadata,
    )
    try:
        return target.add_reward(reward)
    finally:
        if owned:
            target.close()


def emit_span(
    name: str,
    attributes: dict[str, Any] | None = None,
    kind: SpanKind | str = SpanKind.custom,
    *,
    rollout_id: str | None = None,
    attempt_id: str | None = None,
    status: str = "ok",
    error: str | None = None,
    started_at: float | None = None,
    ended_at: float | None = None,
    store: TraceStore | None = None,
    url: str | None = None,
    api_key: str | None = None,
) -> Span:
    """Record a span (e.g. a retrieval or a tool step the gateway cannot see) for the current rollout.

    Args:
        name: what happened, e.g. ``"retrieve"``.
        attributes: JSON-serialisable details (any text round-trips exactly).
        kind: ``"custom"`` (default), ``"tool"`` or ``"llm"``.
        rollout_id: defaults to the current context's rollout.
        attempt_id: defaults to the context's attempt for the same rollout.
        status: ``"ok"`` or ``"error"``.
        error: the error message when ``status="error"``.
        started_at: epoch seconds; defaults to now.
        ended_at: epoch seconds; defaults to ``started_at``.
        store: write here instead of the context's store.
        url: write to the store server at this base URL.
        api_key: the store server's API key (with ``url``).

    Returns:
        The stored span (with ``sequence``).

    Raises:
        UserError: no context and no ``rollout_id``/``store``/``url``; a bad ``kind``/``status``.
        NotFoundError: unknown rollout or attempt.
        StoreError: the store (or server) failed after its retries.
    """
    target, rid, aid, owned = _target("emit_span", rollout_id, attempt_id, store, url, api_key)
    if status not in ("ok", "error"):
        raise UserError(f"emit_span(status={status!r}): use 'ok' or 'error'")
    try:
        span_kind = SpanKind(kind)
    except ValueError:
        raise UserError(f"emit_span(kind={kind!r}): use one of {[k.value for k in SpanKind]}") from None
    start = now() if started_at is None else started_at
    span = Span(
        rollout_id=rid,
        attempt_id=aid,
        kind=span_kind,
        name=name,
        status=status,
        error=error,
        attributes=dict(attributes or {}),
        started_at=start,
        ended_at=start if ended_at is None else ended_at,
    )
    try:
        return target.add_span(span)
    finally:
        if owned:
            target.close()
