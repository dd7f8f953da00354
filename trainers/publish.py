"""Publishing trained adapters through the registry: the store records each new version, serving follows.

A trainer hands every adapter to an :class:`~agentforge.ports.AdapterPublisher` and never touches what is
served itself (DESIGN fact 7). Two publishers implement the port:

* :class:`StorePublisher` (here): records the adapter as the store's new active version; every
  ``agentforge serve`` (:class:`~agentforge.serving.follow.StoreFollower`) watching the store hot-swaps it in.
  :class:`GatedStorePublisher` activates it only once it passed the eval gate (a tenant's lineage, served on
  demand by :class:`~agentforge.serving.tenants.TenantAdapters`, is gated this way).
* :class:`~agentforge.serving.publisher.HotSwapPublisher` (serving layer): trainer and engine share a
  process; it records the version and hot-swaps it in before returning.

The store is the source of truth for the version lineage: the store numbers adapter versions
(``policy@v1``, ``policy@v2``, …), serving loads each under that new name (never an old one, DESIGN fact
2). A trainer that restarts reads the lineage back from the store, so versions continue instead of
starting over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from agentforge.errors import NotFoundError
from agentforge.gate import Decision, EvalGate, Outcome, Stage, judge_versions, record_decision
from agentforge.ports import TraceStore
from agentforge.serving.adapters import read_adapter
from agentforge.types import ResourceVersion, Version, parse_version_number

__all__ = ["StorePublisher", "GatedStorePublisher", "rollback_adapter"]

log = logging.getLogger(__name__)


def _adapter_record(adapter_dir: Path, alias: str, step: int, **extra: object) -> ResourceVersion:
    info = read_adapter(adapter_dir)
    payload = {"path": str(Path(adapter_dir).resolve()), "base_model": info.base_model, "rank": info.max_rank}
    return ResourceVersion(name=alias, kind="adapter", payload={**payload, "step": step, **extra})


class StorePublisher:
    """Out-of-process publisher: record the adapter as the store's new active version and let serving follow.

    For jobs that run away from the serving process (trace replay, a trainer on another machine): the new
    version is activated in the store at once; every ``agentforge serve`` (or :class:`~agentforge.serving.
    follow.StoreFollower`) watching the same store hot-swaps it in within its poll interval, canary first.
    If serving refuses it there (it does not fit the served model, fails to load or fails its canary), serving
    keeps the old version, logs why and moves the store's active version back to what it serves.

    Args:
        store: the trace store serving follows.
        alias: the model alias (resource name), ``"policy"``.

    Raises (``publish``): ``UserError``/``AdapterIncompatibleError`` when the directory is not a LoRA adapter.
    """

    def __init__(self, store: TraceStore, alias: str = "policy") -> None:
        self.store, self.alias = store, alias

    def current(self) -> str:
        """The store's active version (``policy@v0``, the base model, when none was published)."""
        try:
            return self.store.get_resource(self.alias).ref
        except NotFoundError:
            return str(Version(self.alias, 0))

    def publish(self, adapter_dir: Path, step: int) -> str:
        return self.store.publish_resource(_adapter_record(adapter_dir, self.alias, step), activate=True).ref


class GatedStorePublisher(StorePublisher):
    """:class:`StorePublisher` through the eval gate: a new adapter version becomes the active one only when it
    beats the live version on a fixed slice (:class:`~agentforge.gate.EvalGate`'s paired test).

    For lineages that serving loads from the store on demand, a tenant's own ``policy@<tenant>``
    (:class:`~agentforge.serving.tenants.TenantAdapters` serves a pinned, not yet active version too, so the
    candidate can be evaluated before anyone else is served by it). One ``publish``::

        record the adapter (not active)  →  score the live version (once) and the candidate on the slice
        →  passed: activate it (serving picks it up)  |  refused: the live version stays active

    Each step stores a :class:`~agentforge.gate.Decision` (``promotion:<alias>``; ``agentforge versions
    --tenant T`` lists them). Where the gateway's router is in the same process, use
    :class:`~agentforge.serving.promoter.GatedPublisher`, which adds the traffic canary and the automatic
    rollback: for the shared alias built from the engine's ``HotSwapper``, for a tenant's lineage from
    ``TenantLineage(adapters, store, tenant)`` (:mod:`agentforge.serving.lineage`: the canary serves a share of
    that tenant's live rollouts only).

    Args:
        store: the trace store holding the lineage.
        alias: the lineage (``policy@acme``) or alias.
        evaluate: ``evaluate(version) -> scores``, one per example of a fixed slice, same order every call (e.g.
            greedy rollouts pinned to the version, as the lineage's tenant).
        gate: the rule (default :class:`~agentforge.gate.EvalGate`: ``p <= 0.05`` and a positive gain).
        fallback: the version serving while the lineage has no active version (a tenant without an adapter
            is served the shared ``policy@v0``); ``None``: ``<alias>/v0``.

    Attributes:
        decisions: this publisher's decisions, oldest first.

    Raises (``publish``): as :class:`StorePublisher`; whatever ``evaluate`` raises (the candidate is refused
    and recorded first).
    """

    def __init__(
        self,
        store: TraceStore,
        alias: str,
        evaluate: Callable[[str], Sequence[float]],
        gate: EvalGate | None = None,
        fallback: str | None = None,
    ) -> None:
        super().__init__(store, alias)
        self.evaluate, self.gate, self.fallback = evaluate, gate or EvalGate(), fallback
        self.decisions: list[Decision] = []
        self._scores: dict[str, list[float]] = {}  # version → its scores on the slice (fixed: measured once)

    def current(self) -> str:
        """The lineage's active version, else ``fallback`` (else ``<alias>/v0``)."""
        try:
            return self.store.get_resource(self.alias).ref
        except NotFoundError:
            return self.fallback or super().current()

    def publish(self, adapter_dir: Path, step: int) -> str:
        """Put the adapter through the eval gate; return the version active afterwards (the candidate when it
        passed, else the live one)."""
        live = self.current()
        record = self.store.publish_resource(_adapter_record(adapter_dir, self.alias, step), activate=False)
        candidate = record.ref
        try:
            result, evidence = judge_versions(self.gate, self.evaluate, candidate, live, self._scores)
        except BaseException as exc:
            self._decide("eval", "refused", candidate, live, f"the gate could not decide: {exc!r}")
            raise
        self._decide(
            "eval", "passed" if result.passed else "refused", candidate, live, result.reason, evidence
        )
        if not result.passed:
            return live
        self.store.activate_resource(record.name, record.version)
        self._decide(
            "promote",
            "promoted",
            candidate,
            live,
            f"{candidate} is {self.alias}'s active version (was {live})",
        )
        return candidate

    def _decide(
        self,
        stage: Stage,
        outcome: Outcome,
        candidate: str,
        live: str,
        reason: str,
        evidence: dict[str, object] | None = None,
    ) -> None:
        decision = Decision(self.alias, stage, outcome, candidate, live, reason, dict(evidence or {}))
        self.decisions.append(record_decision(self.store, decision))
        log.info("promotion %s %s: %s — %s", stage, outcome, candidate, reason)


def rollback_adapter(store: TraceStore, version: int | str, alias: str = "policy") -> ResourceVersion:
    """Serve an earlier adapter version again, in one call.

    Serving never reloads an old version name (stale-weight risk, DESIGN fact 2), so the rollback publishes
    the earlier version's adapter as a **new** version (payload copied, ``rollback_of`` recorded) and
    activates it; followers hot-swap it like any other. ``version`` 0 (or ``"policy@v0"``) is the base model:
    the base is served again by activating nothing new — the follower swaps back to ``{alias}@v0``.

    Args:
        store: the trace store.
        version: the version to restore: ``3``, ``"3"``, ``"v3"`` or ``"policy@v3"``.
        alias: the model alias (resource name).

    Returns:
        The new active resource (for version 0: a new version whose payload marks the base model).

    Raises:
        NotFoundError: the version does not exist.
        UserError: the version string cannot be parsed.
    """
    number = parse_version_number(version, name=alias)
    if number == 0:
        payload: dict[str, object] = {"base": True, "rollback_of": 0}
    else:
        old = store.get_resource(alias, number)
        payload = {**old.payload, "rollback_of": number}
    return store.publish_resource(ResourceVersion(name=alias, kind="adapter", payload=payload), activate=True)
