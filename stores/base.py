"""The ``TraceStore`` protocol: the contract every store backend (SQLite, PostgreSQL, HTTP client) keeps.

Contract, for every method:

* **Thread- and process-safe.** Many writer processes may call any method at once; nothing is lost and
  no "database is locked" reaches a caller (backends retry internally, then raise ``StoreError``).
* **Idempotent by caller-supplied id.** Adding a span, reward or rollout whose id already exists returns
  the stored object unchanged (no duplicate, no error).
* **Atomic.** ``claim_rollout`` hands one queued rollout to exactly one worker.
* **Unknown ids** raise ``NotFoundError`` (a ``UserError``), never return ``None`` silently, except the
  ``get_*``/``claim_*`` methods documented to return ``None``.
* **Blocking.** Every method blocks until the write is durable (committed).

The conformance suite in ``tests/store_conformance.py`` checks this for every backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

from agentforge.errors import AgentForgeError
from agentforge.types import (
    Attempt,
    AttemptState,
    ResourceVersion,
    Reward,
    Rollout,
    RolloutState,
    Span,
    SpanKind,
)

__all__ = ["TraceStore"]


@runtime_checkable
class TraceStore(Protocol):
    """Durable store of rollouts, attempts, spans, rewards and versioned resources."""

    # --- rollouts -------------------------------------------------------------------------------
    def enqueue_rollout(self, rollout: Rollout) -> Rollout:
        """Store a new rollout in state ``queued``; idempotent by ``rollout.rollout_id``.

        Returns: the stored rollout (the existing one if the id was already present).
        """
        ...

    def get_rollout(self, rollout_id: str) -> Rollout:
        """Return the rollout. Raises: ``NotFoundError``."""
        ...

    def list_rollouts(
        self,
        state: RolloutState | None = None,
        group_id: str | None = None,
        agent: str | None = None,
        since: float | None = None,
        limit: int | None = None,
    ) -> list[Rollout]:
        """Rollouts filtered by state / group / agent / ``created_at >= since`` (seconds), oldest first."""
        ...

    def claim_rollout(self, worker_id: str, agent: str | None = None) -> tuple[Rollout, Attempt] | None:
        """Atomically move the oldest queued rollout to ``running`` and open a new attempt for it.

        Returns: ``(rollout, attempt)`` or ``None`` when nothing is queued.
        """
        ...

    def heartbeat(self, attempt_id: str) -> None:
        """Refresh an attempt's ``heartbeat_at``. Raises: ``NotFoundError``."""
        ...

    def finish_attempt(self, attempt_id: str, state: AttemptState, error: str | None = None) -> Rollout:
        """Close an attempt and move its rollout accordingly.

        ``succeeded`` → rollout ``succeeded``. ``failed``/``timed_out`` → rollout ``queued`` again when
        attempts are left, else the same terminal state. Finishing an attempt that is no longer
        ``running`` (e.g. already abandoned) changes nothing and returns the rollout.

        Raises: ``NotFoundError``.
        """
        ...

    def requeue_stale(self, heartbeat_timeout_s: float) -> list[str]:
        """Abandon running attempts whose last heartbeat is older than ``heartbeat_timeout_s`` seconds;
        their rollouts go back to ``queued`` (or ``failed`` when out of attempts).

        Returns: ids of the affected rollouts.
        """
        ...

    def update_rollout(self, rollout_id: str, **fields: Any) -> Rollout:
        """Update ``metadata``, ``resources`` or ``state`` (checked against the transition table).

        Raises: ``NotFoundError``, ``InvalidTransitionError``.
        """
        ...

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        """All attempts of a rollout, by number."""
        ...

    # --- spans ----------------------------------------------------------------------------------
    def add_span(self, span: Span) -> Span:
        """Store a span (idempotent by ``span_id``); assigns ``sequence``. Orphans (no rollout) allowed."""
        ...

    def list_spans(
        self,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        kind: SpanKind | None = None,
        orphans: bool = False,
        valid_only: bool = False,
    ) -> list[Span]:
        """Spans by ``sequence``. ``orphans=True`` lists spans without a rollout; ``valid_only=True``
        keeps only spans of the rollout's succeeded attempt (or of attempts not abandoned)."""
        ...

    # --- batched writes (group commit) ----------------------------------------------------------
    def write_batch(self, items: Sequence[Span | Reward]) -> list[Span | Reward | AgentForgeError]:
        """Write spans and rewards in order, as one transaction (one request for the HTTP store).

        Each item keeps the rules of ``add_span`` / ``add_reward``; a reward sees the spans before it.

        Returns: one entry per item: the stored item, or the ``NotFoundError``/``UserError`` that item
        alone failed with (nothing of it written). Raises: ``StoreError`` when the batch failed as a whole.
        """
        ...

    def submit(self, item: Span | Reward) -> Future[Span | Reward]:
        """Queue a span or reward for the store's writer thread; the future resolves to the stored item
        once its batch is committed (or to the error of ``add_span``/``add_reward``). ``add_span`` and
        ``add_reward`` are ``submit(item).result()``; async callers ``await asyncio.wrap_future(...)``."""
        ...

    # --- rewards --------------------------------------------------------------------------------
    def add_reward(self, reward: Reward) -> Reward:
        """Store a reward (idempotent by ``reward_id``), attaching it by the rule in ``Reward``'s
        docstring. Raises: ``NotFoundError`` for an unknown rollout."""
        ...

    def list_rewards(self, rollout_id: str) -> list[Reward]:
        """Rewards of a rollout by ``sequence``."""
        ...

    def final_reward(self, rollout_id: str) -> Reward | None:
        """The rollout's training reward by the documented rule, or ``None`` when it has none."""
        ...

    # --- versioned resources ----------------------------------------------------------------------
    def publish_resource(self, resource: ResourceVersion, activate: bool = True) -> ResourceVersion:
        """Store a new version of ``resource.name`` (the store assigns ``version`` = previous + 1)."""
        ...

    def get_resource(self, name: str, version: int | None = None) -> ResourceVersion:
        """The given version, or the active one when ``version`` is ``None``. Raises: ``NotFoundError``."""
        ...

    def activate_resource(self, name: str, version: int) -> ResourceVersion:
        """Make ``version`` the active one (rollback is this call). Raises: ``NotFoundError``."""
        ...

    def list_resources(self, name: str | None = None) -> Sequence[ResourceVersion]:
        """All versions (of one name, or all), by name then version."""
        ...

    def close(self) -> None:
        """Release connections. Safe to call twice."""
        ...
