"""Gated promotion of adapter versions: eval gate → traffic canary → promotion → automatic rollback.

:class:`GatedPublisher` implements the :class:`~agentforge.ports.AdapterPublisher` port, so every trainer that
publishes (``LightningTrainer``, ``ContinualTrainer``, the replay SFT/GRPO jobs) goes through the same gate by
being handed one instead of a :class:`~agentforge.serving.publisher.HotSwapPublisher`. One ``publish``::

    record the adapter in the store (not active)  →  stage it: load + canary request, alias untouched
    →  eval gate: per-example scores of live and candidate on a fixed held-out slice, paired test
    →  traffic canary: a share of live rollouts (sticky by rollout id) is served by the candidate until it
       and the live version served ``rollouts`` each; its mean live reward must not trail the live one's by > margin
    →  promote: the alias flips (one write), the store activates the version
    →  watch (background): after ``window`` live rollouts of the new version, roll back to the previous one
       when its mean live reward trails the previous version's by > margin

Each step stores a :class:`~agentforge.gate.Decision` with its numbers (``promotion:{alias}``; ``agentforge
versions`` shows them). A refused candidate is unloaded and never served by default. No move fails a request:
flips are single writes under the router's lock, and a version drains (its in-flight requests finish) before
it unloads (:class:`~agentforge.serving.hotswap.HotSwapper`).

The same gate moves any lineage (:mod:`agentforge.serving.lineage`): the shared alias of an in-process engine
(built from a ``HotSwapper``), a tenant's own lineage ``policy@<tenant>`` served by
:class:`~agentforge.serving.tenants.TenantAdapters` (its canary takes a sticky share of that tenant's live rollouts
only, its live rewards are that tenant's, its decisions are stored under ``promotion:policy@<tenant>``), or a
lineage that serving follows from the store (eval gate and rollback; no canary).

Live reward of a version: rollouts created during the period that pin nothing for the alias (so no training or
eval rollouts), are not failed, have a final reward with a value, and whose LLM calls were all served by that
version (``LLMCall.version``); a rollout that straddles a flip counts for neither.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentforge.errors import ConfigError
from agentforge.gate import (
    CanaryRule,
    Decision,
    EvalGate,
    LiveComparison,
    Outcome,
    RollbackRule,
    Stage,
    judge_versions,
    record_decision,
)
from agentforge.ports import TraceStore
from agentforge.serving.adapters import read_adapter
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.lineage import Lineage, SwapperLineage
from agentforge.types import ResourceVersion, RolloutState, SpanKind

__all__ = ["GatedPublisher", "LiveRewards"]

log = logging.getLogger(__name__)

#: ``evaluate(version) -> scores``: one score per example of the fixed held-out slice, same order every call.
Evaluate = Callable[[str], Sequence[float]]

_NOT_SCORED = (RolloutState.failed, RolloutState.timed_out, RolloutState.cancelled)


class LiveRewards:
    """Reads the live reward of each version from the store (see the module docstring for what counts).

    Args:
        store: the trace store the gateway writes to.
        alias: the model alias live traffic asks for (``policy``).
        tenant: count only this tenant's rollouts (a tenant's own lineage is judged on its own traffic);
            ``None``: every rollout.
    """

    def __init__(self, store: TraceStore, alias: str, tenant: str | None = None) -> None:
        self.store, self.alias, self.tenant = store, alias, tenant
        self._done: dict[str, tuple[str, float] | None] = {}  # rollout id → (version, reward) or not live

    def collect(self, since: float) -> dict[str, list[float]]:
        """Live rewards per version of the rollouts created at or after ``since`` (epoch seconds).

        Returns:
            version → rewards, in rollout creation order. Rollouts without a reward yet are read again on the
            next call (feedback may arrive late).
        """
        out: dict[str, list[float]] = {}
        for rollout in self.store.list_rollouts(since=since, tenant=self.tenant):
            rid = rollout.rollout_id
            if rid not in self._done:
                if self.alias in rollout.resources or rollout.state in _NOT_SCORED:
                    self._done[rid] = None
                    continue
                reward = self.store.final_reward(rid)
                if reward is None or reward.value is None:
                    continue  # not scored yet
                spans = self.store.list_spans(rollout_id=rid, kind=SpanKind.llm, valid_only=True)
                versions = {s.llm.version for s in spans if s.llm is not None}
                if not versions:
                    continue  # its calls are not recorded yet
                self._done[rid] = (versions.pop(), float(reward.value)) if len(versions) == 1 else None
            hit = self._done[rid]
            if hit is not None:
                out.setdefault(hit[0], []).append(hit[1])
        return out


class GatedPublisher:
    """Publishes adapters through the promotion gate (module docstring); an ``AdapterPublisher``.

    Args:
        swapper: what the gate moves: the serving engine's :class:`HotSwapper` (``retain >= 1`` when ``rollback``
            is set, so the previous version stays loaded and a rollback is one flip), or any
            :class:`~agentforge.serving.lineage.Lineage` (a tenant's: :class:`~agentforge.serving.lineage.
            TenantLineage`).
        store: the trace store (version lineage, live rewards, decisions).
        evaluate: scores a version on the fixed held-out slice (``evaluate("policy@v3") -> [1.0, 0.0, …]``,
            same examples in the same order every call; e.g. greedy rollouts pinned to the version); each
            version is scored once per publisher (a promoted candidate's scores serve as the live ones next
            time). ``None`` skips the eval gate (recorded as ``skipped``).
        gate: the eval gate's rule (default :class:`EvalGate`: ``p <= 0.05`` and a positive gain).
        canary: the traffic canary's rule, or ``None`` to skip it (a trainer with no live traffic: its own
            rollouts pin versions and never count as live). Needs a lineage with a router.
        rollback: the post-promotion watch's rule, or ``None`` for no automatic rollback.
        poll_s: seconds between store reads while a canary or watch waits for rollouts.
        grace_s: seconds between ending a canary and unloading its version, so a request that already chose
            the canary version reaches the router before the version is drained.
        reference_lookback_s: without a canary, the previous version's reference reward for the watch is read
            from live rollouts created this many seconds before the promotion.

    Raises:
        ConfigError: ``rollback`` is set but ``swapper.retain`` is 0, or ``canary`` is set for a lineage without a
            router (one served from the store by another process).
    """

    def __init__(
        self,
        swapper: HotSwapper | Lineage,
        store: TraceStore,
        *,
        evaluate: Evaluate | None = None,
        gate: EvalGate | None = None,
        canary: CanaryRule | None = None,
        rollback: RollbackRule | None = None,
        poll_s: float = 0.5,
        grace_s: float = 1.0,
        reference_lookback_s: float = 3600.0,
    ) -> None:
        lineage = SwapperLineage(swapper, store) if isinstance(swapper, HotSwapper) else swapper
        if rollback is not None and not lineage.keeps_previous:
            raise ConfigError(
                "GatedPublisher: an automatic rollback needs the previous version loaded; build the HotSwapper "
                "with retain >= 1 (and the engine with --max-cpu-loras >= retain + 2)"
            )
        if canary is not None and lineage.router is None:
            raise ConfigError(
                f"GatedPublisher: {lineage.alias} is served from the store by another process, so no traffic "
                "canary can run here; pass canary=None, or publish where the gateway's router is"
            )
        #: the engine's hot swapper when the gate moves the shared alias of an in-process engine, else ``None``
        self.swapper = swapper if isinstance(swapper, HotSwapper) else None
        self.lineage, self.store, self.evaluate = lineage, store, evaluate
        self.gate, self.canary, self.rollback = gate or EvalGate(), canary, rollback
        self.poll_s, self.grace_s, self.reference_lookback_s = poll_s, grace_s, reference_lookback_s
        self.alias = lineage.alias
        self.live = LiveRewards(store, lineage.model, lineage.tenant)
        self.decisions: list[Decision] = []  #: every decision this publisher stored, in order
        self._canary_live: list[float] = []  # the live version's rewards during the last canary
        self._scores: dict[str, list[float]] = {}  # version → its scores on the held-out slice
        #: the trainer's newest adapter, loaded for its own rollouts (:meth:`stage`)
        self.staged: str | None = None
        self._watch: threading.Thread | None = None
        self._stop = threading.Event()

    def current(self) -> str:
        """The version the lineage's live calls are served now (``{alias}@v0`` = base model)."""
        return self.lineage.current()

    def stage(self, adapter_dir: Path, step: int) -> str:
        """Load a trained adapter for the trainer's own rollouts only: routable under its version name (requests
        that pin it), never served by default and never judged; the previously staged version is unloaded.

        On-policy GRPO samples each batch from the newest weights (Shao et al. 2024), while the gate may keep an
        older version serving: a trainer that samples tasks (not live traffic) pins its rollouts to
        :meth:`sampling_version`. The version is recorded in the store (inactive, ``payload["staged"]``).

        Args:
            adapter_dir: the PEFT adapter directory.
            step: the trainer's optimizer step (stored with the version).

        Returns:
            The staged version's name (``policy@v7``).

        Raises:
            AdapterIncompatibleError, ServingError: loading failed (nothing new is staged; the previous staged
                version stays).
        """
        _, version = self._load_inactive(adapter_dir, step, staged=True)
        self.unstage()
        self.staged = version
        return version

    def unstage(self) -> None:
        """Unload the staged version, if any (waits for its in-flight requests); a no-op when it serves."""
        staged, self.staged = self.staged, None
        if staged is not None and staged != self.current():
            self.lineage.discard(staged)

    def sampling_version(self) -> str:
        """The version a trainer's own rollouts pin: the staged one (:meth:`stage`), else :meth:`current`."""
        return self.staged or self.current()

    def publish(self, adapter_dir: Path, step: int) -> str:
        """Put the adapter through the gate; return the version that serves by default afterwards.

        Blocks through staging, the eval gate and the canary (until the candidate and the live version each
        served ``canary.rollouts`` live rollouts, at most ``canary.timeout_s``); first waits for a running
        watch of the previous promotion to end. The watch of this promotion runs in the background (:meth:`wait_watch`).

        Args:
            adapter_dir: the PEFT adapter directory.
            step: the trainer's optimizer step (stored with the version).

        Returns:
            The candidate's version name when promoted, else the live version's (which keeps serving).

        Raises:
            AdapterIncompatibleError, ServingError: staging failed (as :meth:`HotSwapper.swap`); the candidate
                is refused (recorded) and the live version keeps serving.
            Whatever ``evaluate`` raises (e.g. ``RolloutTimeout``): the candidate is refused (recorded) and
                unloaded first.
        """
        self.wait_watch()
        live = self.current()
        record, candidate = self._load_inactive(adapter_dir, step, live=live)
        stage: Stage = "eval"
        try:
            passed = self._eval_passes(candidate, live)
            if passed and self.canary is not None:
                stage = "canary"
                passed = self._run_canary(candidate, live).passed
        except BaseException as exc:
            # a stage that cannot finish refuses the candidate (after the canary's grace), then propagates
            self._decide(stage, "refused", candidate, live, f"the gate could not decide: {exc!r}")
            time.sleep(self.grace_s if stage == "canary" else 0.0)
            self.lineage.discard(candidate)
            raise
        if not passed:
            self.lineage.discard(candidate)
            return live
        reference = self._canary_live if self.canary is not None else None
        self.unstage()  # the promoted version is the newest: the trainer samples it through the alias
        self.lineage.promote(candidate)  # serves by default and is the store's active version
        self._decide("promote", "promoted", candidate, live, f"{candidate} serves {self.alias} (was {live})")
        if self.rollback is not None:
            self._start_watch(candidate, live, reference, time.time())
        return candidate

    def _load_inactive(
        self, adapter_dir: Path, step: int, live: str | None = None, **extra: Any
    ) -> tuple[ResourceVersion, str]:
        """Record the adapter in the store (not active; ``extra`` joins its payload) and load it in the engine
        under that record's version without moving the alias; return the record and the version name. With
        ``live`` (a publish), a load that fails is stored as the candidate's refusal before it propagates."""
        info = read_adapter(adapter_dir)
        payload = {
            "path": str(Path(adapter_dir).resolve()),
            "base_model": info.base_model,
            "rank": info.max_rank,
            "step": step,
            **extra,
        }
        record = self.store.publish_resource(
            ResourceVersion(name=self.alias, kind="adapter", payload=payload), activate=False
        )
        try:
            return record, self.lineage.load(adapter_dir, record.ref)
        except Exception as exc:
            if live is not None:
                self._decide("eval", "refused", record.ref, live, f"the engine could not load it: {exc!r}")
            raise

    # --- the stages -------------------------------------------------------------------------------------
    def _decide(
        self,
        stage: Stage,
        outcome: Outcome,
        candidate: str,
        live: str,
        reason: str,
        evidence: dict[str, Any] | None = None,
    ) -> Decision:
        """Store one decision (and keep it in :attr:`decisions`)."""
        decision = record_decision(
            self.store, Decision(self.alias, stage, outcome, candidate, live, reason, dict(evidence or {}))
        )
        self.decisions.append(decision)
        log.info("promotion %s %s: %s — %s", stage, outcome, candidate, reason)
        return decision

    def _eval_passes(self, candidate: str, live: str) -> bool:
        if self.evaluate is None:
            self._decide("eval", "skipped", candidate, live, "no held-out slice configured")
            return True
        result, evidence = judge_versions(self.gate, self.evaluate, candidate, live, self._scores)
        outcome = "passed" if result.passed else "refused"
        self._decide("eval", outcome, candidate, live, result.reason, evidence)
        return result.passed

    def _run_canary(self, candidate: str, live: str) -> LiveComparison:
        rule, router, key = self.canary, self.lineage.router, self.lineage.canary_key
        assert rule is not None and router is not None
        since = time.time()
        self.lineage.reload(candidate)  # a tenant's candidate may have been evicted while the eval gate ran
        router.set_canary(key, candidate, rule.share)
        deadline = time.monotonic() + rule.timeout_s
        try:
            while True:
                rewards = self.live.collect(since)
                arms = min(len(rewards.get(candidate, [])), len(rewards.get(live, [])))
                if arms >= rule.rollouts or time.monotonic() > deadline:
                    break
                time.sleep(self.poll_s)
        finally:
            router.clear_canary(key)
        cand, self._canary_live = rewards.get(candidate, [])[: rule.rollouts], rewards.get(live, [])
        result = rule.judge(cand, self._canary_live)
        evidence = {
            **result.evidence(),
            "share": rule.share,
            "rollouts": rule.rollouts,
            "seconds": round(time.time() - since, 3),
        }
        self._decide(
            "canary", "passed" if result.passed else "refused", candidate, live, result.reason, evidence
        )
        if not result.passed:
            time.sleep(self.grace_s)
        return result

    def _start_watch(self, promoted: str, previous: str, reference: list[float] | None, at: float) -> None:
        if reference is None:
            reference = self.live.collect(at - self.reference_lookback_s).get(previous, [])
        self._stop.clear()
        self._watch = threading.Thread(
            target=self._watch_loop,
            args=(promoted, previous, reference, at),
            name=f"watch-{promoted}",
            daemon=True,
        )
        self._watch.start()

    def _watch_loop(self, promoted: str, previous: str, reference: list[float], at: float) -> None:
        rule = self.rollback
        assert rule is not None
        deadline = time.monotonic() + rule.timeout_s
        try:
            while not self._stop.is_set():
                rewards = self.live.collect(at).get(promoted, [])
                if len(rewards) >= rule.window or time.monotonic() > deadline:
                    break
                self._stop.wait(self.poll_s)
            result = rule.judge(rewards, reference)
            evidence = {**result.evidence(), "window": rule.window, "seconds": round(time.time() - at, 3)}
            if len(rewards) < rule.window or result.passed:
                why = result.reason if len(rewards) >= rule.window else f"window not filled: {result.reason}"
                self._decide("watch", "kept", promoted, previous, why, evidence)
                return
            self.lineage.promote(previous, rollback=True)  # one move; the promoted version is retired
            self._decide("watch", "rolled_back", promoted, previous, result.reason, evidence)
        except Exception as exc:  # noqa: BLE001 - a watch thread must not die silently
            log.exception("the watch of %s failed", promoted)
            self._decide("watch", "kept", promoted, previous, f"watch failed: {exc!r}")

    def wait_watch(self, timeout_s: float | None = None) -> bool:
        """Wait for the running post-promotion watch to decide; True when none is running (any more)."""
        watch = self._watch
        if watch is not None:
            watch.join(timeout_s)
        return watch is None or not watch.is_alive()

    def stop_watch(self) -> None:
        """End a running watch now; it records ``kept`` with what it had seen (e.g. at shutdown)."""
        self._stop.set()
        self.wait_watch()
