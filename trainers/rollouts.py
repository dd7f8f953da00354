"""From prompts TRL hands the trainer to finished, scored rollouts and back to TRL samples.

One call of :class:`RolloutSource` = one GRPO generation batch: for each distinct task in the batch it
enqueues ``G`` rollouts (one group, pinned to the policy version serving now), waits until runners —
in any process, on any machine — finish them through the gateway, and turns each rollout into one sample
by the rules below. Every rule that drops signal is *counted* in :class:`BatchReport`:

* a rollout that did not succeed (failed, timed out, not finished in time) → masked, ``failed``;
* no reward, or a ``None``/NaN reward → masked, ``missing_reward`` (TRL treats a ``None`` reward as
  unscorable: excluded from the group baseline, advantage 0 — never 0 reward, never NaN);
* LLM spans without engine ids/logprobs → masked, ``invalid``; no LLM call at all → ``no_trainable_tokens``;
* produced by a version more than ``max_staleness`` versions behind → masked, ``stale``;
* a rollout whose calls split into several trajectories (see :mod:`.samples`) trains on its **last**
  trajectory (the one that produced the final answer); the others are counted as ``extra_trajectories``.

A masked sample keeps its slot (TRL needs ``len(prompts)`` samples) with one placeholder token whose
``env_mask`` is 0, so no gradient flows from it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentforge.errors import RolloutTimeout, UserError
from agentforge.ports import BatchReport, SampleSource, TraceStore
from agentforge.runtime.tasks import enqueue_tasks, wait_for_rollouts
from agentforge.trainers.samples import (
    SAMPLE_COLUMNS,
    SampleValidationError,
    build_trajectories,
    masked_sample,
    trajectory_sample,
)
from agentforge.types import Rollout, RolloutState, SpanKind, Task, new_id, parse_version_number

__all__ = ["BatchReport", "RolloutSource", "SampleSource", "stored_reward"]


class RolloutSource:
    """TRL ``rollout_func`` backed by the trace store and external runners.

    Args:
        store: the trace store the runners also use.
        tasks: task id → task (the training dataset's ``prompt`` column holds task ids).
        group_size: ``G`` rollouts per task (TRL's ``num_generations``).
        current_version: returns the policy version serving now (rollouts are pinned to it).
        alias: the model alias pinned in each rollout's resources.
        placeholder_token_id: the id used for masked samples' one-token prompt/completion.
        agent, timeout_s, max_attempts: copied onto each enqueued rollout.
        wait_timeout_s: how long to wait for a batch, seconds; unfinished rollouts then count as failed.
        max_staleness: versions a sample may lag behind ``current_version()``.
        run_id: identifies this training run on every rollout (``metadata.trainer_run``).
        poll_s: store polling interval while waiting, seconds.
    """

    def __init__(
        self,
        store: TraceStore,
        tasks: dict[str, Task],
        group_size: int,
        current_version: Callable[[], str],
        *,
        alias: str = "policy",
        placeholder_token_id: int = 0,
        agent: str = "",
        timeout_s: float = 300.0,
        max_attempts: int = 2,
        wait_timeout_s: float = 1800.0,
        max_staleness: int = 1,
        run_id: str | None = None,
        poll_s: float = 0.2,
    ) -> None:
        self.store, self.tasks, self.group_size = store, tasks, group_size
        self.current_version, self.alias = current_version, alias
        self.placeholder = placeholder_token_id
        self.agent, self.timeout_s, self.max_attempts = agent, timeout_s, max_attempts
        self.wait_timeout_s, self.max_staleness, self.poll_s = wait_timeout_s, max_staleness, poll_s
        self.run_id = run_id or new_id("run")
        self.step = 0
        self.reports: list[BatchReport] = []

    def prompts(self) -> list[str]:
        """The task ids (the training dataset's ``prompt`` column)."""
        return list(self.tasks)

    # --- TRL entry point ------------------------------------------------------------------------
    def __call__(self, prompts: Sequence[Any], trainer: Any = None) -> dict[str, list[Any]]:
        """Run one batch. ``prompts`` are task ids, each repeated ``G`` times consecutively (TRL's sampler).

        Returns:
            TRL's ``rollout_func`` dict: ``prompt_ids``, ``completion_ids``, ``logprobs``, ``env_mask``,
            plus ``reward``, ``rollout_id``, ``version`` per sample.
        """
        if trainer is not None:
            self.step = int(trainer.state.global_step)
        rollouts = self.enqueue(prompts)
        report = BatchReport(rollouts=len(rollouts), groups=len(prompts) // self.group_size)
        t0 = time.monotonic()
        finished = self.wait(rollouts)
        report.wait_s = time.monotonic() - t0
        out = self.samples(finished, report)
        self.reports.append(report)
        for rollout in finished:  # record consumption: a rollout is trained on by exactly one step
            self.store.update_rollout(
                rollout.rollout_id, metadata={**rollout.metadata, "trained_step": self.step}
            )
        return out

    def enqueue(self, prompts: Sequence[Any]) -> list[Rollout]:
        """Enqueue one group of ``G`` rollouts per run of ``G`` equal prompt entries (TRL's sampler order)."""
        version = self.current_version()
        rollouts: list[Rollout] = []
        for start in range(0, len(prompts), self.group_size):
            rollouts += enqueue_tasks(
                self.store,
                [self.tasks[str(prompts[start])]],
                group_size=len(prompts[start : start + self.group_size]),
                resources={self.alias: version},
                agent=self.agent,
                max_attempts=self.max_attempts,
                timeout_s=self.timeout_s,
                metadata={"trainer_run": self.run_id, "step": self.step},
            )
        return rollouts

    def wait(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        """Poll until every rollout is finished or ``wait_timeout_s`` passed; return their latest state.

        Raises:
            RolloutTimeout: nothing at all finished within ``wait_timeout_s`` (no runner is serving).
        """
        ids = [r.rollout_id for r in rollouts]
        try:
            return wait_for_rollouts(self.store, ids, timeout_s=self.wait_timeout_s, poll_s=self.poll_s)
        except RolloutTimeout:  # some did not finish in time: train on those that did
            latest = {rid: self.store.get_rollout(rid) for rid in ids}
        pending = {rid for rid, r in latest.items() if not r.state.finished}
        for rid in pending:  # not started in time: withdraw from the queue so no runner wastes work on it
            if latest[rid].state == RolloutState.queued:
                try:
                    latest[rid] = self.store.update_rollout(rid, state=RolloutState.cancelled)
                except UserError:  # claimed meanwhile; it finishes untrained
                    pass
        if len(pending) == len(latest):
            raise RolloutTimeout(
                f"none of {len(latest)} rollouts finished within {self.wait_timeout_s}s; is a runner serving "
                f"agent {self.agent or '(any)'!r} against this store?"
            )
        return [latest[r.rollout_id] for r in rollouts]

    # --- samples ----------------------------------------------------------------------------------
    def samples(self, rollouts: Sequence[Rollout], report: BatchReport) -> dict[str, list[Any]]:
        """One sample per rollout by the module's rules; fills ``report``."""
        current = parse_version_number(self.current_version(), default=0)
        out: dict[str, list[Any]] = {k: [] for k in SAMPLE_COLUMNS}
        for rollout in rollouts:
            sample, reason = self._sample(rollout, current, report)
            if reason is not None:
                report.skipped[reason] += 1
                sample = self._masked(rollout)
            for key, value in sample.items():
                out[key].append(value)
        for start in range(0, len(rollouts), self.group_size):
            valid = [r for r in out["reward"][start : start + self.group_size] if r is not None]
            if len(valid) >= 2 and max(valid) == min(valid):
                report.zero_variance_groups += 1
        report.rewards = [r for r in out["reward"] if r is not None]
        return out

    def _sample(
        self, rollout: Rollout, current: int, report: BatchReport
    ) -> tuple[dict[str, Any], str | None]:
        if rollout.state != RolloutState.succeeded:
            return {}, "failed"
        spans = self.store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm, valid_only=True)
        try:
            trajectories = build_trajectories(spans)
        except SampleValidationError:
            return {}, "invalid"
        if not trajectories or trajectories[-1].sampled_tokens == 0:
            return {}, "no_trainable_tokens"
        traj = trajectories[-1]
        report.extra_trajectories += len(trajectories) - 1
        report.split_rollouts += int(len(trajectories) > 1)
        oldest = min(parse_version_number(v, default=0) for v in traj.versions)
        if current - oldest > self.max_staleness:
            return {}, "stale"
        reward = self.store.final_reward(rollout.rollout_id)
        if reward is None or reward.value is None or not math.isfinite(reward.value):
            return {}, "missing_reward"
        report.truncated += int(traj.truncated)
        report.sampled_tokens += traj.sampled_tokens
        return trajectory_sample(traj, float(reward.value), rollout.rollout_id), None

    def _masked(self, rollout: Rollout) -> dict[str, Any]:
        return masked_sample(rollout.rollout_id, self.placeholder)


def stored_reward(
    prompts: list[Any], completions: list[Any], reward: list[float | None], **_: Any
) -> list[float | None]:
    """TRL reward function that returns the rewards the scorers stored (``None`` = unscorable, masked)."""
    return list(reward)
