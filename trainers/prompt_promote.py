"""Gated promotion of prompt versions: traffic canary → activation → automatic rollback.

The prompt-side twin of :class:`~agentforge.serving.promoter.GatedPublisher` (the eval gate itself runs where
the candidate is found: :func:`~agentforge.trainers.prompt_opt.optimize_prompt` judges it with
:class:`~agentforge.gate.EvalGate` on held-out tasks, then hands it to :meth:`PromptPromoter.promote`)::

    canary: start_prompt_canary — a share of unpinned live rollouts (sticky by rollout id) reads the candidate
    (RolloutContext.prompt) until it and the live version served ``rollouts`` each; its mean reward must not
    trail the live one's by > margin   →   activate   →   watch (background): after ``window`` live rollouts
    of the new version, activate the previous one again if its mean reward trails the canary's live mean
    by > margin

A prompt flip is one store write that the next rollouts read, so no request can fail on it. Every decision is a
:class:`~agentforge.gate.Decision` (``promotion:{name}``). Live reward of a prompt version: rollouts created in
the period that are not evaluations (no ``eval`` or ``prompt_opt`` metadata), not failed, with a final reward
with a value, that recorded the version they read in ``Rollout.resources[name]``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from agentforge.gate import CanaryRule, Decision, Outcome, RollbackRule, Stage, record_decision
from agentforge.ports import TraceStore
from agentforge.prompts import end_prompt_canary, start_prompt_canary
from agentforge.types import RolloutState, Version

__all__ = ["PromptPromoter"]

_NOT_SCORED = (RolloutState.failed, RolloutState.timed_out, RolloutState.cancelled)


class PromptPromoter:
    """Activates prompt versions only through a traffic canary, and rolls them back when live reward drops.

    Args:
        store: the trace store the runners read prompts from.
        name: the prompt's resource name (``prompt:triage``).
        canary: the traffic canary's rule, or ``None`` to activate at once.
        rollback: the post-activation watch's rule, or ``None`` for no automatic rollback.
        poll_s: seconds between store reads while waiting for rollouts.
    """

    def __init__(
        self,
        store: TraceStore,
        name: str,
        *,
        canary: CanaryRule | None = None,
        rollback: RollbackRule | None = None,
        poll_s: float = 0.5,
    ) -> None:
        self.store, self.name, self.canary, self.rollback, self.poll_s = store, name, canary, rollback, poll_s
        self.decisions: list[Decision] = []  #: every decision this promoter stored, in order
        self._watch: threading.Thread | None = None

    def _ref(self, version: int) -> str:
        return str(Version(self.name, version))

    def _decide(
        self,
        stage: Stage,
        outcome: Outcome,
        version: int,
        live: int,
        reason: str,
        evidence: dict[str, Any] | None = None,
    ) -> None:
        decision = Decision(
            self.name, stage, outcome, self._ref(version), self._ref(live), reason, evidence or {}
        )
        self.decisions.append(record_decision(self.store, decision))

    def live_rewards(self, since: float) -> dict[int, list[float]]:
        """Live rewards per prompt version of the rollouts created at or after ``since`` (epoch seconds)."""
        out: dict[int, list[float]] = {}
        for rollout in self.store.list_rollouts(since=since):
            used = rollout.resources.get(self.name)
            if used is None or rollout.state in _NOT_SCORED or {"eval", "prompt_opt"} & set(rollout.metadata):
                continue
            reward = self.store.final_reward(rollout.rollout_id)
            if reward is not None and reward.value is not None:
                out.setdefault(int(used), []).append(float(reward.value))
        return out

    def promote(self, version: int, live: int) -> int:
        """Put prompt ``version`` through the canary and activate it; return the active version afterwards.

        Blocks through the canary (at most ``canary.timeout_s``); the watch runs in the background
        (:meth:`wait_watch`).

        Args:
            version: the candidate (published, not active).
            live: the active version it is compared with (and rolled back to).

        Returns:
            ``version`` when activated, else ``live``.

        Raises:
            NotFoundError: ``version`` does not exist.
        """
        self.wait_watch()
        reference: list[float] = []
        if self.canary is not None:
            rule, since = self.canary, time.time()
            start_prompt_canary(self.store, self.name, version, rule.share)
            deadline = time.monotonic() + rule.timeout_s
            try:
                while True:
                    rewards = self.live_rewards(since)
                    arms = min(len(rewards.get(version, [])), len(rewards.get(live, [])))
                    if arms >= rule.rollouts or time.monotonic() > deadline:
                        break
                    time.sleep(self.poll_s)
            finally:
                end_prompt_canary(self.store, self.name)
            reference = rewards.get(live, [])
            result = rule.judge(rewards.get(version, [])[: rule.rollouts], reference)
            evidence = {**result.evidence(), "share": rule.share, "rollouts": rule.rollouts}
            self._decide(
                "canary", "passed" if result.passed else "refused", version, live, result.reason, evidence
            )
            if not result.passed:
                return live
        self.store.activate_resource(self.name, version)
        self._decide(
            "promote", "promoted", version, live, f"{self._ref(version)} is active (was {self._ref(live)})"
        )
        if self.rollback is not None:
            at = time.time()
            self._watch = threading.Thread(
                target=self._watch_loop, args=(version, live, reference, at), name="watch-prompt", daemon=True
            )
            self._watch.start()
        return version

    def _watch_loop(self, version: int, live: int, reference: list[float], at: float) -> None:
        rule = self.rollback
        assert rule is not None
        deadline = time.monotonic() + rule.timeout_s
        while True:
            rewards = self.live_rewards(at).get(version, [])
            if len(rewards) >= rule.window or time.monotonic() > deadline:
                break
            time.sleep(self.poll_s)
        result = rule.judge(rewards, reference)
        evidence = {**result.evidence(), "window": rule.window}
        if len(rewards) < rule.window or result.passed:
            self._decide("watch", "kept", version, live, result.reason, evidence)
            return
        self.store.activate_resource(self.name, live)
        self._decide("watch", "rolled_back", version, live, result.reason, evidence)

    def wait_watch(self, timeout_s: float | None = None) -> bool:
        """Wait for the running watch to decide; True when none is running (any more)."""
        if self._watch is not None:
            self._watch.join(timeout_s)
        return self._watch is None or not self._watch.is_alive()
