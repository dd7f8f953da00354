"""The ports: the contracts every room codes against, in one module at the bottom of the layers.

Rooms above (runtime, serving, trainers, agents, the CLI) import these Protocols, never a concrete backend;
only the wiring rooms (:mod:`agentforge.cli`, :mod:`agentforge.commands`, :mod:`agentforge.stack` and
:func:`agentforge.open.open_store`) choose which implementation stands behind a port
(``docs/architecture.md``; the layers are checked by import-linter, ``make lint``).

* :class:`TraceStore` — durable store of rollouts, attempts, spans, rewards and versioned resources
  (implemented by ``agentforge.stores.sql.SQLStore`` and ``agentforge.stores.http.HTTPStore``);
* :class:`PolicyServer` — an inference engine serving a base model plus LoRA adapters
  (``agentforge.serving.vllm.VLLMServer``, ``agentforge.serving.embedded.EmbeddedServer``);
* :class:`AdapterPublisher` — where a trainer sends each new adapter
  (``agentforge.serving.publisher.HotSwapPublisher`` in-process, ``agentforge.trainers.publish.StorePublisher``
  through the store);
* :class:`SampleSource` with its :class:`BatchReport` — what the GRPO trainer trains on
  (``agentforge.trainers.rollouts.RolloutSource`` and the replay/continual sources).

**TraceStore** contract, for every method:

* **Thread- and process-safe.** Many writer processes may call any method at once; nothing is lost and
  no "database is locked" reaches a caller (backends retry internally, then raise ``StoreError``).
* **Idempotent by caller-supplied id.** Adding a span, reward or rollout whose id already exists returns
  the stored object unchanged (no duplicate, no error).
* **Atomic.** ``claim_rollout`` hands one queued rollout to exactly one worker.
* **Unknown ids** raise ``NotFoundError`` (a ``UserError``), never return ``None`` silently, except the
  ``get_*``/``claim_*`` methods documented to return ``None``.
* **Blocking.** Every method blocks until the write is durable (committed).

The conformance suite in ``tests/support/store_conformance.py`` checks this for every backend.

**PolicyServer** contract:

* ``start``/``stop`` block until the engine is healthy / gone; ``stop`` is safe twice.
* ``load_adapter`` validates first (base model, LoRA rank against the server maximum) and raises
  ``AdapterIncompatibleError`` *before touching the engine*; every load uses a **new** name
  (``policy@v8``), never an in-place reload under an old name (vLLM's prefix cache would serve the old
  adapter's KV).
* ``unload_adapter`` of an unknown name raises ``NotFoundError``.
* Engine failures raise ``ServingError``.

Importing this module imports only the types and errors.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agentforge.errors import AgentForgeError
from agentforge.queries import RolloutPage, RolloutQuery
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

__all__ = ["TraceStore", "PolicyServer", "AdapterPublisher", "SampleSource", "BatchReport"]


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
        *,
        tenant: str | None = None,
        after: str | None = None,
    ) -> list[Rollout]:
        """Rollouts filtered by state / group / agent / ``created_at >= since`` (seconds) / ``tenant``,
        oldest first, at most ``limit``; ``after``: only those enqueued after that rollout id (a keyset cursor:
        the last id of the previous page). Raises: ``NotFoundError`` (``after`` unknown, or not visible)."""
        ...

    def page_rollouts(self, query: RolloutQuery) -> RolloutPage:
        """One page of rollouts matching ``query``, newest (last enqueued) first, each with its training
        reward, the policy versions of its LLM calls and their count (:mod:`agentforge.queries`).

        Keyset paging: a page costs the same wherever it starts; pass ``page.next`` as ``query.before`` for
        the next, older page. Read-only.
        """
        ...

    def claim_rollout(
        self, worker_id: str, agent: str | None = None, *, attempt_id: str | None = None
    ) -> tuple[Rollout, Attempt] | None:
        """Atomically move the oldest queued rollout to ``running`` and open a new attempt for it.

        ``attempt_id`` names the attempt to open; a claim repeated with the id of an attempt that exists
        (its answer was lost) returns that attempt and its rollout again instead of claiming another.

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

        Raises: ``NotFoundError``, ``InvalidTransitionError``; ``UserError`` for another field or a wrong type
        (``state`` a state or its name, ``metadata`` an object, ``resources`` an object of strings).
        """
        ...

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        """All attempts of a rollout, by number."""
        ...

    # --- spans ----------------------------------------------------------------------------------
    def add_span(self, span: Span) -> Span:
        """Store a span (idempotent by ``span_id``); assigns ``sequence``. Orphans (no rollout) allowed.

        An LLM span arriving after its rollout finished (or after the attempt it names ended) is stored as
        *late*: ``attributes["late"] = True`` plus ``attributes["late_reason"]``, and ``list_spans(valid_only=
        True)`` never returns it, so it cannot rewrite a finished rollout's training data."""
        ...

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
        """Spans by ``sequence``. ``orphans=True`` lists spans without a rollout; ``valid_only=True``
        keeps only spans of the rollout's succeeded attempt (or of attempts not abandoned); ``tenant``
        keeps only spans recorded for that tenant; ``after_sequence`` / ``limit`` read one keyset page
        (``limit`` rows of the sequence order after ``after_sequence``, counted before ``valid_only``)."""
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
        ``add_reward`` are ``submit(item).result()``; async callers ``await asyncio.wrap_future(...)``, or
        :meth:`submit_async` where the store has it."""
        ...

    # Optional: ``submit_async(item) -> asyncio.Future`` (SQLStore and HTTPStore have it): ``submit`` for a
    # coroutine, the future belongs to the running loop and the writer resolves a batch's futures with one
    # loop wake-up; the item is written even if the future is cancelled. The gateway uses it when present.

    # --- rewards --------------------------------------------------------------------------------
    def add_reward(self, reward: Reward) -> Reward:
        """Store a reward (idempotent by ``reward_id``), attaching it by the rule in ``Reward``'s
        docstring. Raises: ``NotFoundError`` for an unknown rollout; ``UserError`` for an infinite value
        (``None``/NaN is stored invalid) or an id that is not URL-safe."""
        ...

    def list_rewards(
        self, rollout_id: str, *, after_sequence: int | None = None, limit: int | None = None
    ) -> list[Reward]:
        """Rewards of a rollout by ``sequence``: those after ``after_sequence``, at most ``limit``."""
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

    def list_resources(
        self, name: str | None = None, *, after: tuple[str, int] | None = None, limit: int | None = None
    ) -> Sequence[ResourceVersion]:
        """All versions (of one name, or all), by name then version: those after ``after`` = ``(name,
        version)`` in that order, at most ``limit``."""
        ...

    def close(self) -> None:
        """Release connections. Safe to call twice."""
        ...


@runtime_checkable
class PolicyServer(Protocol):
    """An OpenAI-compatible engine with runtime LoRA loading."""

    base_model: str
    max_lora_rank: int

    @property
    def base_url(self) -> str:
        """OpenAI-compatible base URL ending in ``/v1``."""
        ...

    @property
    def base_model_name(self) -> str:
        """The model name the engine serves the base weights under."""
        ...

    def start(self) -> None:
        """Start the engine and block until it answers its health check. Raises: ``ServingError``."""
        ...

    def stop(self) -> None:
        """Stop the engine and free its resources."""
        ...

    def load_adapter(self, name: str, path: str) -> None:
        """Load the PEFT adapter at ``path`` under the new name ``name``.

        Raises: ``AdapterIncompatibleError`` (checked before loading), ``ServingError``.
        """
        ...

    def unload_adapter(self, name: str) -> None:
        """Unload a previously loaded adapter. Raises: ``NotFoundError``, ``ServingError``."""
        ...

    def adapters(self) -> list[str]:
        """Names of the adapters currently loaded."""
        ...


@runtime_checkable
class AdapterPublisher(Protocol):
    """Where the trainer sends each new adapter. ``publish`` blocks until the new version serves."""

    def current(self) -> str:
        """The version the alias serves now (``policy@v0`` = base model)."""
        ...

    def publish(self, adapter_dir: Path, step: int) -> str:
        """Make the adapter at ``adapter_dir`` the served version; return its versioned name.

        Raises: ``AdapterIncompatibleError`` (refused before loading), ``ServingError`` (load/canary failed;
        the previous version keeps serving).
        """
        ...


@dataclass
class BatchReport:
    """What one generation batch contained; every dropped sample is counted under a reason.

    Attributes:
        rollouts: rollouts enqueued.
        groups: groups (tasks) trained on in the batch.
        zero_variance_groups: trained groups whose valid rewards are all equal (zero advantage, reported).
        dropped_groups: groups sampled but not trained on: dynamic sampling (``RolloutSource(extra_tasks=)``)
            sampled more groups than the step trains and left out these, whose rewards were all equal.
        truncated: samples whose last call ended with ``finish_reason == "length"``.
        extra_trajectories: trajectories beyond the ones trained per rollout (one, or ``trajectories_per_rollout``:
            a conversation that split trains its last piece); logged as ``batch/extra_trajectories`` and
            ``batch/split_share``.
        split_rollouts: trained rollouts whose calls split into more than one trajectory.
        skipped: count per skip reason (``failed``, ``missing_reward``, ``invalid``, ``stale``,
            ``no_trainable_tokens``, ``unmatched_logprobs``: stored logprobs the trainer cannot recompute;
            ``fewer_trajectories``: masked rows of rollouts with fewer than ``trajectories_per_rollout``).
        rewards: the valid rewards of every sampled rollout (trained or in a dropped group), in batch order.
        sampled_tokens: tokens the policy sampled across trained samples.
        forced_tokens: of those, tokens a grammar forced (guided calls; trained with loss mask 0, see
            :mod:`agentforge.trainers.samples`); logged as ``batch/forced_token_share`` (÷ ``sampled_tokens``).
        wait_s: seconds spent waiting for runners.
        parts: the named reward parts of the sampled rollouts (``Reward.metadata["parts"]``, e.g. the tool turn's
            ``tool``, ``arguments``, ``reply``, ``success``), part → values in batch order; logged as
            ``batch/part/<name>`` (the mean over the samples that report the part).
    """

    rollouts: int = 0
    groups: int = 0
    zero_variance_groups: int = 0
    dropped_groups: int = 0
    truncated: int = 0
    extra_trajectories: int = 0
    split_rollouts: int = 0
    skipped: Counter[str] = field(default_factory=Counter[str])
    rewards: list[float] = field(default_factory=list[float])
    sampled_tokens: int = 0
    forced_tokens: int = 0
    wait_s: float = 0.0
    parts: dict[str, list[float]] = field(default_factory=dict[str, list[float]])

    def metrics(self) -> dict[str, float]:
        """Flat metrics for logging (shares are fractions of the batch)."""
        n = max(self.rollouts, 1)
        mean = sum(self.rewards) / len(self.rewards) if self.rewards else math.nan
        var = sum((r - mean) ** 2 for r in self.rewards) / len(self.rewards) if self.rewards else math.nan
        out = {
            "batch/extra_trajectories": float(self.extra_trajectories),
            "batch/split_share": self.split_rollouts / n,
            "batch/reward_mean": mean,
            "batch/reward_std": math.sqrt(var) if self.rewards else math.nan,
            "batch/zero_variance_share": self.zero_variance_groups / max(self.groups, 1),
            "batch/dropped_groups": float(self.dropped_groups),
            "batch/truncated_share": self.truncated / n,
            "batch/sampled_tokens": float(self.sampled_tokens),
            "batch/forced_token_share": self.forced_tokens / max(self.sampled_tokens, 1),
            "batch/wait_s": self.wait_s,
        }
        reasons = (
            "failed",
            "missing_reward",
            "invalid",
            "stale",
            "no_trainable_tokens",
            "unmatched_logprobs",
        )
        for reason in reasons:
            out[f"batch/skipped_{reason}"] = float(self.skipped.get(reason, 0))
        for name, values in sorted(self.parts.items()):
            out[f"batch/part/{name}"] = sum(values) / len(values) if values else math.nan
        return out


@runtime_checkable
class SampleSource(Protocol):
    """What :class:`~agentforge.trainers.grpo_trainer.LightningTrainer` trains on: TRL's ``rollout_func`` plus
    the dataset it samples from.

    TRL's sampler draws entries of :meth:`prompts` and repeats each ``G`` times consecutively; the trainer
    hands each batch to ``__call__`` on the main process only (other ranks receive their slice of the
    result), so a source may block, poll a store and write to it without coordinating ranks.

    Attributes:
        run_id: identifies the training run on whatever the source writes (rollouts, metadata); the trainer
            sets it (an attribute, or a property with a setter).
        reports: one :class:`BatchReport` per call, appended by ``__call__`` (the trainer logs the last; read
            only, so a wrapper may hand out its inner source's list).
    """

    @property
    def run_id(self) -> str: ...

    @run_id.setter
    def run_id(self, value: str) -> None: ...

    @property
    def reports(self) -> list[BatchReport]: ...

    def prompts(self) -> list[str]:
        """The dataset's ``prompt`` column: one entry per group (a task id, a group id, a slot)."""
        ...

    def __call__(self, prompts: Sequence[Any], trainer: Any = None) -> dict[str, list[Any]]:
        """One generation batch: ``len(prompts)`` samples in TRL's ``rollout_func`` layout (see
        :func:`~agentforge.trainers.samples.to_rollout_func_output`); may block. A sample that must not train
        keeps its slot as :func:`~agentforge.trainers.samples.masked_sample`. Raises whatever ends training (e.g. ``RolloutTimeout``)."""
        ...


@runtime_checkable
class TenantDirectory(Protocol):
    """Who a presented key acts for (:mod:`agentforge.stores.tenants`: the store's key → tenant table).

    The gateway and the store API ask it about every key that is not their own; one answer may be remembered
    for a few seconds (``TenantKeyCache``), so a revoked key is refused within that interval, without a restart.
    """

    def tenant_of_key(self, key: str) -> str | None:
        """The tenant ``key`` acts for, or ``None`` (not a tenant key, unknown or revoked). May block (a store
        read); never raises for a bad key."""
        ...
