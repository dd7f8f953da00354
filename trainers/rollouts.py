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
* a span whose stored logprobs the trainer cannot recompute (its engine's log-prob mode or its sampling
  settings, :mod:`.logprob_match`) → masked, ``unmatched_logprobs`` (each reason is logged);
* tokens a grammar forced in a guided call (:mod:`.samples`) stay in the sample with loss mask 0, counted
  as ``batch/forced_token_share``;
* a rollout whose calls split into several trajectories (see :mod:`.samples`) trains on its **last**
  trajectory (the one that produced the final answer); the others are counted as ``extra_trajectories``;
* **several conversations per rollout** (``trajectories_per_rollout = k > 1``): an agent whose rollout holds
  ``k`` conversations by design — the branches of a LangGraph graph that run concurrently, each its own chat —
  fills ``k`` rows of its group, its last ``k`` trajectories in order of their first call, each with the
  rollout's reward (so each branch gets the rollout's advantage); a rollout with fewer fills the rest with masked
  rows (``fewer_trajectories``). A TRL group is then ``G × k`` rows: ``G`` rollouts, ``k`` rows each, and
  TRL's group mean and spread are over the ``G × k`` rows, which equal the ``G`` rollouts' when every rollout
  has ``k`` trajectories (the design case: each rollout's reward counted ``k`` times).

**Dynamic sampling** (DAPO, Yu et al. 2025, §3.2: "over-sample and filter out prompts with the accuracy equal to
1 and 0"): with ``extra_tasks = k > 0`` a batch also runs ``k`` more groups, on tasks drawn from the rest of the
pool (seeded by ``seed`` and the step, so a resumed step draws the same ones), and trains on the batch's size in
groups chosen in order — groups whose rewards differ first, then groups whose rewards are all equal — so a
group that carries no advantage takes a trained slot only when too few others do. The groups left out are
counted (``dropped_groups``); rewards and parts are reported over every sampled rollout, so the batch reward
stays the policy's, not the selection's. Rollouts are cheap next to a training row on a small CPU or a large
GPU alike: the trainer spends its compute only on rows with a gradient.

A masked sample keeps its slot (TRL needs ``len(prompts)`` samples) with one placeholder token whose
``env_mask`` is 0, so no gradient flows from it.

**Incomplete groups: exclude, never keep.** A masked member's reward is ``None`` even when the rollout has one (a
stale rollout's reward was earned by another policy; an invalid or unmatched one has no tokens to credit), so
TRL (1.16, ``_generate_and_score_completions``: ``nanmean``/``nanstd`` per group, then ``nan_to_num``) leaves
it out of its group's baseline and spread and gives it advantage 0 — counting it as reward 0 would move every
other member's advantage. A group left with one usable member has no baseline: every advantage is 0 and it
counts as a group without signal (``batch/signal_group_share``), not as a flat one (``zero_variance_groups``).
``tests/unit/trainers/test_incomplete_groups.py`` checks TRL's advantages for both cases.

**The store is the cursor.** Every rollout carries ``metadata.trainer_run`` (the run id, kept across restarts
in ``{output_dir}/agentforge-run.json``) and ``metadata.step`` (the optimizer step whose batch it belongs to,
0-based). It gets ``metadata.trained_step`` only once that optimizer step has finished (:meth:`RolloutSource.
mark_trained`, called by the trainer after the update), never when the batch is formed. After a restart
(``kill -9``, a crash), the first batch of each step looks for the rollouts this run already formed for that
step and trains on them instead of enqueuing new ones: a batch that was formed, or half enqueued, when the
process died is trained exactly once, by the step it was formed for; a group whose task the resumed run did
not draw again is logged as a warning (the data order changed) and left untrained.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentforge.errors import RolloutTimeout, UserError
from agentforge.ports import BatchReport, SampleSource, TraceStore
from agentforge.runtime.tasks import enqueue_tasks, wait_for_rollouts
from agentforge.trainers.samples import (
    GRPO_COLUMNS,
    SampleValidationError,
    Trajectory,
    build_trajectories,
    grpo_sample,
    masked_sample,
    to_rollout_func_output,
    with_token_columns,
)
from agentforge.types import (
    TRAINED_STEP,
    Rollout,
    RolloutState,
    SpanKind,
    Task,
    check_tenant,
    new_id,
    parse_version_number,
)

__all__ = ["BatchReport", "FixedGroups", "RolloutSource", "SampleSource", "stored_reward"]

logger = logging.getLogger("agentforge.trainer")


class RolloutSource:
    """TRL ``rollout_func`` backed by the trace store and external runners.

    Args:
        store: the trace store the runners also use.
        tasks: task id → task (the training dataset's ``prompt`` column holds task ids).
        group_size: rows per task, TRL's ``num_generations``: ``group_size / trajectories_per_rollout``
            rollouts.
        current_version: returns the policy version serving now (rollouts are pinned to it).
        alias: the model alias pinned in each rollout's resources.
        placeholder_token_id: the id used for masked samples' one-token prompt/completion.
        agent, timeout_s, max_attempts: copied onto each enqueued rollout.
        wait_timeout_s: how long to wait for a batch, seconds; unfinished rollouts then count as failed.
        max_staleness: versions a sample may lag behind ``current_version()``.
        run_id: identifies this training run on every rollout (``metadata.trainer_run``).
        poll_s: store polling interval while waiting, seconds.
        tenant: train one tenant's lineage on that tenant's rollouts only: every rollout is enqueued for the
            tenant (and read back filtered by it), pinning ``current_version()`` (the tenant's version, e.g.
            ``StorePublisher(store, alias="policy@acme").current``) under ``alias``. ``None``: no tenant.
        extra_tasks: dynamic sampling (module docstring): groups sampled per batch beyond the ones trained;
            0 = off.
        seed: seeds the draw of the extra tasks (with the step).
        explored: train raw-logprob spans sampled at a temperature other than 1 (an explored tool decision)
            as temperature-1 samples instead of excluding them
            (:func:`~agentforge.trainers.logprob_match.stored_logprob_temperature`).
        trajectories_per_rollout: rows each rollout fills, its last ``k`` trajectories (module docstring).

    Raises:
        UserError: ``extra_tasks`` is negative, or ``trajectories_per_rollout`` does not divide ``group_size``.
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
        tenant: str | None = None,
        extra_tasks: int = 0,
        seed: int = 0,
        explored: bool = False,
        trajectories_per_rollout: int = 1,
    ) -> None:
        if extra_tasks < 0:
            raise UserError(f"RolloutSource(extra_tasks={extra_tasks}): must be >= 0")
        if trajectories_per_rollout < 1 or group_size % trajectories_per_rollout:
            raise UserError(
                f"RolloutSource(trajectories_per_rollout={trajectories_per_rollout}) must be >= 1 and divide "
                f"group_size={group_size} (a group is group_size / trajectories_per_rollout rollouts)"
            )
        self.store, self.tasks, self.group_size = store, tasks, group_size
        self.rows_per_rollout = trajectories_per_rollout
        self.extra_tasks, self.seed, self.explored = extra_tasks, seed, explored
        self.tenant = None if tenant is None else check_tenant(tenant)
        self.current_version, self.alias = current_version, alias
        self.placeholder = placeholder_token_id
        self.agent, self.timeout_s, self.max_attempts = agent, timeout_s, max_attempts
        self.wait_timeout_s, self.max_staleness, self.poll_s = wait_timeout_s, max_staleness, poll_s
        self.run_id = run_id or new_id("run")
        self.step = 0
        self.reports: list[BatchReport] = []
        self.untrained: list[Rollout] = []  # the last batch, until mark_trained records its optimizer step
        self._formed: dict[int, list[Rollout]] | None = None  # this run's earlier rollouts, by step

    def prompts(self) -> list[str]:
        """The task ids (the training dataset's ``prompt`` column)."""
        return list(self.tasks)

    # --- TRL entry point ------------------------------------------------------------------------
    def __call__(self, prompts: Sequence[Any], trainer: Any = None) -> dict[str, list[Any]]:
        """Run one batch. ``prompts`` are task ids, each repeated ``G`` times consecutively (TRL's sampler): one
        row each, ``G / trajectories_per_rollout`` rollouts per task.

        Returns:
            TRL's ``rollout_func`` dict: ``prompt_ids``, ``completion_ids``, ``logprobs``, ``env_mask``,
            plus ``reward``, ``rollout_id``, ``version`` per sample.
        """
        if trainer is not None:
            self.step = int(trainer.state.global_step)
        trained = len(prompts)
        rollouts = self.enqueue([*prompts, *self.extra_prompts(prompts)])
        report = BatchReport(rollouts=len(rollouts), groups=trained // self.group_size)
        t0 = time.monotonic()
        finished = self.wait(rollouts)
        report.wait_s = time.monotonic() - t0
        out = self.samples(finished, report, trained)
        self.reports.append(report)
        self.untrained = finished  # marked by mark_trained once the optimizer step is done, not now
        return out

    def extra_prompts(self, prompts: Sequence[Any]) -> list[str]:
        """Dynamic sampling's extra groups for this step: ``extra_tasks`` task ids not in ``prompts``, each
        repeated ``G`` times, drawn with ``random.Random(f"{seed}/{step}")`` (the same draw after a restart)."""
        if not self.extra_tasks:
            return []
        taken = {str(p) for p in prompts}
        pool = sorted(t for t in self.tasks if t not in taken)
        drawn = random.Random(f"{self.seed}/{self.step}").sample(pool, min(self.extra_tasks, len(pool)))
        return [t for t in drawn for _ in range(self.group_size)]

    def mark_trained(self, step: int) -> None:
        """Record that the optimizer step ``step`` (0-based) has trained on the last batch.

        Called by the trainer after the update (the rollouts of a batch a crash interrupted stay unmarked, and
        the resumed run trains them). Sets ``metadata.trained_step`` on each rollout of the batch; idempotent.
        """
        for rollout in self.untrained:
            latest = self.store.get_rollout(rollout.rollout_id)
            self.store.update_rollout(rollout.rollout_id, metadata={**latest.metadata, TRAINED_STEP: step})
        self.untrained = []

    def formed_earlier(self, step: int) -> list[Rollout]:
        """The rollouts this run enqueued for ``step`` before this process started (oldest first).

        The store is read once per process, at the first batch: afterwards every batch is formed here.
        """
        if self._formed is None:
            self._formed = defaultdict(list)
            for rollout in self.store.list_rollouts(agent=self.agent or None, tenant=self.tenant):
                meta = rollout.metadata
                if meta.get("trainer_run") == self.run_id and isinstance(meta.get("step"), int):
                    if meta["step"] >= step:  # earlier steps are in the checkpoint's weights already
                        self._formed[meta["step"]].append(rollout)
        return self._formed.pop(step, [])

    def enqueue(self, prompts: Sequence[Any]) -> list[Rollout]:
        """One group of ``G`` rollouts per run of ``G`` equal prompt entries (TRL's sampler order): the group this
        run already formed for the task at this step (before a restart), else a newly enqueued one."""
        version = self.current_version()
        earlier: dict[str, list[list[Rollout]]] = defaultdict(list)  # task id -> groups formed earlier
        for rollout in self.formed_earlier(self.step):
            groups = earlier[rollout.task.task_id]
            if not groups or groups[-1][0].group_id != rollout.group_id:
                groups.append([])
            groups[-1].append(rollout)
        rollouts: list[Rollout] = []
        for start in range(0, len(prompts), self.group_size):
            size = len(prompts[start : start + self.group_size]) // self.rows_per_rollout
            formed = earlier.get(str(prompts[start]))
            if formed and len(formed[0]) == size:  # resume: the batch formed before the restart trains now
                rollouts += formed.pop(0)
                continue
            rollouts += enqueue_tasks(
                self.store,
                [self.tasks[str(prompts[start])]],
                group_size=size,
                resources={self.alias: version},
                agent=self.agent,
                max_attempts=self.max_attempts,
                timeout_s=self.timeout_s,
                metadata={"trainer_run": self.run_id, "step": self.step},
                tenant=self.tenant,
            )
        left = sorted({r.task.task_id for groups in earlier.values() for g in groups for r in g})
        if left:
            logger.warning(
                "step %d: the resumed run did not draw tasks %s again, whose groups it formed for this step before "
                "the restart; they stay untrained (the data order changed: resume with the checkpoint's full "
                "state and the same seed, tasks and tasks_per_step)",
                self.step,
                ", ".join(left),
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
    def samples(
        self, rollouts: Sequence[Rollout], report: BatchReport, trained: int | None = None
    ) -> dict[str, list[Any]]:
        """``trajectories_per_rollout`` samples per rollout by the module's rules, then the ``trained`` samples'
        groups (all when ``None``; dynamic sampling's choice when fewer, module docstring); fills ``report``."""
        current = parse_version_number(self.current_version(), default=0)
        rows: list[dict[str, Any]] = []
        for rollout in rollouts:
            samples, reason = self._sample(rollout, current, report)
            if reason is not None:
                report.skipped[reason] += 1
                samples = []
            missing = self.rows_per_rollout - len(samples)
            if samples and missing:
                report.skipped["fewer_trajectories"] += missing
            rows += [self._masked(rollout) for _ in range(missing)] + samples
        k = self.rows_per_rollout  # a rollout's last row holds its reward whenever it has one
        report.rewards = [r["reward"] for r in rows[k - 1 :: k] if r["reward"] is not None]
        groups = [rows[i : i + self.group_size] for i in range(0, len(rows), self.group_size)]
        valid = [[r["reward"] for r in g if r["reward"] is not None] for g in groups]
        flat = [len(v) >= 2 and max(v) == min(v) for v in valid]  # all advantages 0
        signal = [len(v) >= 2 and max(v) != min(v) for v in valid]  # some advantage is not 0
        keep = len(groups) if trained is None else trained // self.group_size
        chosen = sorted(sorted(range(len(groups)), key=lambda i: not signal[i])[:keep])
        report.dropped_groups = len(groups) - len(chosen)
        report.zero_variance_groups = sum(flat[i] for i in chosen)
        out: dict[str, list[Any]] = {k: [] for k in GRPO_COLUMNS}
        for i in chosen:
            for sample in groups[i]:
                for key, value in sample.items():
                    out[key].append(value)
        return out

    def _sample(
        self, rollout: Rollout, current: int, report: BatchReport
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The rollout's samples (its last ``trajectories_per_rollout`` trajectories with a sampled token, in
        order) or the reason it trains on none."""
        if rollout.state != RolloutState.succeeded:
            return [], "failed"
        spans = self.store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm, valid_only=True)
        try:
            trajectories = build_trajectories(spans, explored=self.explored)
        except SampleValidationError as exc:  # e.g. a doubled BOS: say why once per batch, not only count it
            if not report.skipped.get("invalid"):
                logger.warning(
                    "rollout %s is not trained on (skipped as invalid): %s", rollout.rollout_id, exc
                )
            return [], "invalid"
        if not trajectories or trajectories[-1].sampled_tokens == 0:
            return [], "no_trainable_tokens"
        trained = [t for t in trajectories if t.sampled_tokens][
            -self.rows_per_rollout :
        ]  # ends with the last
        report.extra_trajectories += len(trajectories) - len(trained)
        report.split_rollouts += int(len(trajectories) > len(trained))
        oldest = min(parse_version_number(v, default=0) for t in trained for v in t.versions)
        if current - oldest > self.max_staleness:
            return [], "stale"
        if any(unmatched_logprobs(t, self.step) for t in trained):
            return [], "unmatched_logprobs"
        reward = self.store.final_reward(rollout.rollout_id)
        if reward is None or reward.value is None or not math.isfinite(reward.value):
            return [], "missing_reward"
        for traj in trained:
            report.truncated += int(traj.truncated)
            report.sampled_tokens += traj.sampled_tokens
            report.forced_tokens += traj.forced_tokens
        parts = reward.metadata.get("parts") or {}
        for name, value in parts.items():
            if isinstance(value, int | float) and math.isfinite(value):
                report.parts.setdefault(str(name), []).append(float(value))
        return [grpo_sample(t, float(reward.value), rollout.rollout_id, parts) for t in trained], None

    def _masked(self, rollout: Rollout) -> dict[str, Any]:
        return with_token_columns(masked_sample(rollout.rollout_id, self.placeholder), None)


def unmatched_logprobs(traj: Trajectory, step: int) -> bool:
    """Whether ``traj`` must be excluded because a span's stored logprobs cannot be recomputed (logged)."""
    if traj.unmatched:
        logger.warning(
            "step %d: excluded rollout %s, its stored logprobs cannot be matched: %s",
            step,
            traj.rollout_id,
            "; ".join(traj.unmatched),
        )
    return bool(traj.unmatched)


def stored_reward(
    prompts: list[Any], completions: list[Any], reward: list[float | None], **_: Any
) -> list[float | None]:
    """TRL reward function that returns the rewards the scorers stored (``None`` = unscorable, masked)."""
    return list(reward)


class FixedGroups:
    """A :class:`~agentforge.ports.SampleSource` whose groups and rewards never change: a GRPO update without an
    engine (tests, benchmarks: ``LightningTrainer(..., source=FixedGroups(groups, rewards))``).

    TRL's sampler repeats each group's prompt ``G`` times in a batch; the ``k``-th copy gets member ``k`` of
    that group and its reward.

    Args:
        groups: group id (the dataset's prompt) → its ``G`` trajectories.
        rewards: group id → the ``G`` rewards, in member order.
        run_id: the source's run id.
    """

    def __init__(
        self,
        groups: Mapping[str, Sequence[Trajectory]],
        rewards: Mapping[str, Sequence[float]],
        run_id: str = "fixed-groups",
    ) -> None:
        self.groups, self.rewards, self.run_id = groups, rewards, run_id
        self.reports: list[BatchReport] = []

    def prompts(self) -> list[str]:
        return list(self.groups)

    def __call__(self, prompts: Sequence[Any], trainer: Any = None) -> dict[str, list[Any]]:
        seen: dict[str, int] = {}
        trajs, rewards = [], []
        for p in prompts:
            k = seen[p] = seen.get(p, -1) + 1
            trajs.append(self.groups[p][k])
            rewards.append(self.rewards[p][k])
        self.reports.append(BatchReport(groups=len(seen), rewards=rewards))
        return to_rollout_func_output(trajs, rewards)
