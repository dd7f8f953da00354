"""What an agent sees while it runs one attempt: :class:`RolloutContext`, and the guard on its store.

The runner builds one :class:`RolloutContext` per attempt and calls ``agent(task, ctx)``. The agent
points its OpenAI client at ``ctx.base_url`` (``{gateway}/rollouts/{rollout_id}/v1``) and sends
``ctx.default_headers`` (``X-Attempt-Id``), so the gateway attributes every LLM call to this attempt;
it reads the pinned resource versions from ``ctx.resources`` and may record rewards and spans through
``ctx.emit_reward`` / ``ctx.emit_span`` (or the plain :mod:`agentforge.tracing` functions, which see
the same context). ``ctx.engine`` (an :class:`EngineEndpoint`, when the runner knows it) is the inference
engine's own address, for LLM calls that must not be recorded or trained on, e.g. a simulated customer.

``ctx.store`` is an :class:`AttemptStore`: the real store, except that once the runner has closed the
attempt (finished, timed out, given back at shutdown) it refuses the agent's writes. A sync agent
that timed out keeps running in its abandoned thread (Python cannot kill a thread); the guard makes
sure it can no longer attach rewards or spans to a rollout that has moved on.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentforge.errors import RolloutTimeout, UserError
from agentforge.tracing import TraceContext, emit_reward, emit_span
from agentforge.types import Reward, Rollout, Span, SpanKind

if TYPE_CHECKING:
    from openai import AsyncOpenAI, OpenAI

    from agentforge.ports import TraceStore

__all__ = ["RolloutContext", "AttemptStore", "EngineEndpoint", "SharedHttpClient", "bound_tool_output"]

#: Placeholder API key for OpenAI clients pointed at a gateway that needs none.
_NO_KEY = "agentforge-no-key"


class AttemptStore:
    """A :class:`~agentforge.ports.TraceStore` view for one attempt that closes with it.

    Every method is the wrapped store's, except that :meth:`add_span` and :meth:`add_reward` raise
    :class:`~agentforge.errors.RolloutTimeout` once :meth:`close` was called (the attempt finished,
    timed out or was given back). Reads keep working.

    Args:
        store: the real store.
        attempt_id: the attempt this view belongs to (for the error message).
    """

    def __init__(self, store: TraceStore, attempt_id: str) -> None:
        self.inner, self.attempt_id = store, attempt_id
        self._closed = threading.Event()
        self._reason = ""

    def close(self, reason: str = "closed") -> None:
        """Refuse further writes; ``reason`` goes into the error they raise. Safe to call twice."""
        if not self._closed.is_set():
            self._reason = reason
            self._closed.set()

    @property
    def closed(self) -> bool:
        """Whether writes are refused."""
        return self._closed.is_set()

    def _check(self, what: str) -> None:
        if self._closed.is_set():
            raise RolloutTimeout(
                f"{what} refused: attempt {self.attempt_id} is over ({self._reason}); "
                "a write after the runner closed the attempt would attach to a rollout that moved on"
            )

    def add_span(self, span: Span) -> Span:
        """See :meth:`TraceStore.add_span`. Raises: ``RolloutTimeout`` after :meth:`close`."""
        self._check("add_span")
        return self.inner.add_span(span)

    def add_reward(self, reward: Reward) -> Reward:
        """See :meth:`TraceStore.add_reward`. Raises: ``RolloutTimeout`` after :meth:`close`."""
        self._check("add_reward")
        return self.inner.add_reward(reward)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"AttemptStore({self.inner!r}, attempt={self.attempt_id!r}, closed={self.closed})"


@dataclass(frozen=True)
class EngineEndpoint:
    """The inference engine's own OpenAI-compatible address, behind the gateway's back.

    Calls sent here are neither recorded nor attributed to a rollout, so they are never trained on: the
    endpoint for a simulated customer or a judge that should use the served base model. ``agentforge serve``
    prints it (``engine URL  model M  key K``); ``agentforge train`` prints it and hands it to every agent as
    ``ctx.engine``.

    Attributes:
        base_url: the engine's ``/v1`` root, e.g. ``http://127.0.0.1:40123/v1``.
        api_key: its inference key (new at each engine start; it cannot load adapters), ``""`` when none.
        model: the base model's served name (e.g. ``base``); adapter versions are served only through the
            gateway's alias.
    """

    base_url: str
    api_key: str = ""
    model: str = "base"

    def openai_client(self, **kwargs: Any) -> OpenAI:
        """An ``openai.OpenAI`` client on the engine (``kwargs`` override, e.g. ``max_retries``).

        Raises:
            MissingExtraError: ``openai`` is not installed.
        """
        try:
            from openai import OpenAI
        except ImportError as exc:  # pragma: no cover - depends on the environment
            from agentforge.errors import MissingExtraError

            raise MissingExtraError("openai", "agents", "EngineEndpoint.openai_client()") from exc
        return OpenAI(**{"base_url": self.base_url, "api_key": self.api_key or _NO_KEY, **kwargs})


@dataclass(frozen=True)
class RolloutContext(TraceContext):
    """Everything an agent needs for one attempt (a richer :class:`agentforge.tracing.TraceContext`).

    Attributes:
        store: the trace store, as an :class:`AttemptStore` that refuses writes after the attempt.
        rollout_id: the rollout being run.
        attempt_id: this attempt (also sent as the ``X-Attempt-Id`` header).
        base_url: ``{gateway}/rollouts/{rollout_id}/v1``: point the OpenAI client here.
        resources: the versions pinned to this rollout, e.g. ``{"policy": "policy@v3",
            "prompt:cs-system": "2"}``.
        default_headers: headers for every gateway call (``{"X-Attempt-Id": attempt_id}``).
        api_key: the gateway's API key (a placeholder when the gateway needs none).
        rollout: the rollout as claimed (task, metadata, ``attempts`` = this attempt's number).
        worker_id: the worker running the attempt, ``"<host>:<pid>:<name>"``.
        timeout_s: the attempt's wall-clock limit, seconds.
        http_client: a worker-wide ``httpx.Client`` reused by :meth:`openai_client` (connection reuse;
            building a fresh one costs ~25 ms); its ``close`` is a no-op for the agent.
        engine: the inference engine's own address (:class:`EngineEndpoint`) for calls that must not be
            recorded, e.g. a simulated customer; ``None`` when the runner was not given it (``agentforge
            train`` gives it; ``agentforge run`` with ``--engine-url``).
    """

    base_url: str = ""
    resources: dict[str, str] = field(default_factory=dict)
    default_headers: dict[str, str] = field(default_factory=dict)
    api_key: str = _NO_KEY
    rollout: Rollout | None = None
    worker_id: str = ""
    timeout_s: float = 600.0
    http_client: Any = field(default=None, repr=False, compare=False)
    engine: EngineEndpoint | None = None

    @property
    def attempt_number(self) -> int:
        """1 for the first try, 2 for the first retry, ..."""
        return self.rollout.attempts if self.rollout is not None else 1

    @property
    def model(self) -> str:
        """The model name to request: the pinned ``resources["policy"]``, else the alias ``"policy"``."""
        return self.resources.get("policy", "policy")

    def prompt(self, name: str, default: str | None = None) -> str:
        """The text of prompt ``name`` for this rollout, recorded on the rollout.

        The version is the one the rollout pins (``resources[name]``, e.g. a prompt optimiser's
        candidate), else a running traffic canary's when this rollout falls in its share
        (:func:`agentforge.prompts.start_prompt_canary`), else the active one (published as version 1 from ``default`` when the store has
        none; see :func:`agentforge.prompts.get_prompt`). The version used is written to
        ``Rollout.resources[name]`` (``"2"``) so traces can be filtered by prompt version, and to
        :attr:`resources`, so later calls in this attempt (and its retries) get the same version.

        Args:
            name: the prompt's resource name, e.g. ``prompt:triage``.
            default: the template published as version 1 when the store has no version of ``name``.

        Returns:
            The template text.

        Raises:
            NotFoundError: the pinned version does not exist, or ``name`` is absent and ``default`` is
                ``None``.
        """
        from agentforge.prompts import get_prompt

        pinned = self.resources.get(name)
        resource = get_prompt(self.store, name, version=pinned, default=default, rollout_id=self.rollout_id)
        used = str(resource.version)
        if pinned != used:
            rollout = self.store.get_rollout(self.rollout_id)
            self.store.update_rollout(self.rollout_id, resources={**rollout.resources, name: used})
            self.resources[name] = used
        return str(resource.payload.get("template", ""))

    def emit_reward(
        self, value: float | None, name: str = "reward", final: bool = False, **metadata: Any
    ) -> Reward:
        """Record a reward for this attempt (see :func:`agentforge.tracing.emit_reward`).

        Args:
            value: the reward; ``None``/NaN is stored as an invalid reward, never as 0.
            name: what it measures.
            final: make it the rollout's training reward whatever comes after it.
            **metadata: stored with the reward.

        Returns:
            The stored reward.

        Raises:
            RolloutTimeout: the attempt is already over (e.g. the agent timed out).
        """
        return emit_reward(
            value,
            name,
            final,
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            store=self.store,
            **metadata,
        )

    def emit_span(
        self,
        name: str,
        attributes: dict[str, Any] | None = None,
        kind: SpanKind | str = SpanKind.custom,
        **kw: Any,
    ) -> Span:
        """Record a span for this attempt (see :func:`agentforge.tracing.emit_span` for ``**kw``).

        Raises:
            RolloutTimeout: the attempt is already over.
        """
        return emit_span(
            name,
            attributes,
            kind,
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            store=self.store,
            **kw,
        )

    def openai_client(self, **kwargs: Any) -> OpenAI:
        """An ``openai.OpenAI`` client for this attempt: gateway base URL, attempt header, API key and
        a request timeout of :attr:`timeout_s` seconds. ``kwargs`` override (e.g. ``max_retries``).

        Raises:
            MissingExtraError: ``openai`` is not installed.
        """
        from openai import OpenAI

        if self.http_client is not None:
            kwargs.setdefault("http_client", self.http_client)
        return OpenAI(**self._client_kwargs(kwargs))

    def async_openai_client(self, **kwargs: Any) -> AsyncOpenAI:
        """Like :meth:`openai_client`, for ``openai.AsyncOpenAI``."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(**self._client_kwargs(kwargs))

    def _client_kwargs(self, overrides: dict[str, Any]) -> dict[str, Any]:
        try:
            import openai  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the environment
            from agentforge.errors import MissingExtraError

            raise MissingExtraError("openai", "agents", "RolloutContext.openai_client()") from exc
        headers = {**self.default_headers, **overrides.pop("default_headers", {})}
        return {
            "base_url": self.base_url,
            "api_key": self.api_key,
            "default_headers": headers,
            "timeout": self.timeout_s,
            **overrides,
        }


class SharedHttpClient:
    """Lazily builds one ``openai.DefaultHttpxClient`` per worker whose ``close()`` (called by an agent
    closing its OpenAI client) does nothing; :meth:`shutdown` really closes it."""

    def __init__(self) -> None:
        self._client: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        """The shared client, or ``None`` when ``openai`` is not installed."""
        with self._lock:
            if self._client is None:
                try:
                    from openai import DefaultHttpxClient
                except ImportError:  # pragma: no cover - depends on the environment
                    return None

                class _Shared(DefaultHttpxClient):
                    def close(self) -> None:  # the worker owns it
                        pass

                    def shutdown(self) -> None:
                        super().close()

                self._client = _Shared()
            return self._client

    def shutdown(self) -> None:
        """Close the client (if it was built). Safe to call twice."""
        with self._lock:
            if self._client is not None:
                self._client.shutdown()
                self._client = None


def bound_tool_output(text: str, max_chars: int) -> str:
    """Cut a tool's output to at most ``max_chars`` characters, saying how much was dropped.

    The head of ``text`` is kept and ``…[truncated N chars]`` appended (``N`` = characters dropped), so
    the model knows the output was longer. Text that fits is returned unchanged. The cut never splits a
    UTF-16 surrogate pair left in a ``str`` (e.g. from ``surrogateescape`` decoding).

    Args:
        text: the tool's output (any Unicode).
        max_chars: the budget in characters (Python ``str`` code points), marker included.

    Returns:
        ``text`` itself, or a string of at most ``max_chars`` characters ending with the marker (when
        ``max_chars`` is smaller than the marker alone, just the marker).

    Raises:
        UserError: ``max_chars`` is negative.
    """
    if max_chars < 0:
        raise UserError(f"bound_tool_output(max_chars={max_chars}): the budget must be >= 0 characters")
    if len(text) <= max_chars:
        return text
    keep = max_chars
    while True:
        marker = f"…[truncated {len(text) - keep} chars]"
        if keep + len(marker) <= max_chars or keep == 0:
            break
        keep = max(0, max_chars - len(marker))
    if keep and "\ud800" <= text[keep - 1] <= "\udbff":
        keep -= 1
        marker = f"…[truncated {len(text) - keep} chars]"
    return text[:keep] + marker
