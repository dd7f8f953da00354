"""Prompt optimisation with GEPA: evolve a prompt version by reflecting on real, scored rollouts.

GEPA (Agrawal et al. 2025, "GEPA: Reflective Prompt Evolution Can Outperform Reinforcement Learning",
arXiv:2507.19457; PyPI ``gepa``) keeps a pool of candidate prompts. Each iteration it runs a parent on a
small training minibatch, shows a *reflection LM* the inputs, outputs and feedback, takes the instruction
it proposes, runs that on the same minibatch, and, if it scores higher, scores it on the validation set
and adds it to the pool (Pareto selection over validation examples).

Here every evaluation is a set of **real rollouts**: :class:`RolloutPromptAdapter` publishes the candidate
as a prompt version *without activating it* (live traffic keeps the active version), enqueues one rollout
per example pinned to that version (``resources={name: "7"}``), lets the runners execute the unchanged
agent (which reads ``ctx.prompt(name)``), and reads the rollouts' final rewards from the store. The
reflection LM is any OpenAI-compatible endpoint (:class:`ReflectionLM`). At the end the best candidate is
activated only if it beats the seed on held-out data, optionally by a paired significance test on the same
held-out examples (:func:`optimize_prompt`, :func:`~agentforge.trainers.prompt_report.paired_test`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from agentforge.errors import ConfigError, MissingExtraError, RunError
from agentforge.gate import Decision, EvalGate, record_decision
from agentforge.prompts import list_prompts, publish_prompt
from agentforge.runtime.tasks import enqueue_tasks, wait_for_rollouts
from agentforge.trainers.prompt_promote import PromptPromoter
from agentforge.trainers.prompt_reflection import REFLECTION_TEMPLATE, Feedback, ReflectionLM, label_feedback
from agentforge.trainers.prompt_report import PairedTest, PromptCandidate, PromptOptResult, paired_test
from agentforge.types import RolloutState, SpanKind, Task, Version, new_id

if TYPE_CHECKING:
    from gepa.core.adapter import EvaluationBatch, ProposalFn
    from rich.progress import Progress

    from agentforge.ports import TraceStore

__all__ = [
    "REFLECTION_TEMPLATE",
    "ReflectionLM",
    "label_feedback",
    "RolloutPromptAdapter",
    "evaluate_prompt",
    "optimize_prompt",
    "PairedTest",
    "paired_test",
    "PromptCandidate",
    "PromptOptResult",
]

#: Why a winner chosen on the validation scores is not activated on them (the decision's reason, the summary).
VAL_ONLY = (
    "the validation scores selected it among every candidate and cannot also judge it; "
    "held-out tasks (testset, --test-tasks) decide activation"
)


class RolloutPromptAdapter:
    """A ``gepa.GEPAAdapter`` whose evaluations are runner rollouts pinned to unactivated prompt versions.

    Data instances are :class:`~agentforge.types.Task` s; a candidate is ``{name: template}``. Runners
    executing an agent that reads ``ctx.prompt(name)`` must be working on ``store`` (e.g. a
    ``LocalStack``). Scores are the rollouts' final rewards (a failed or unscored rollout scores 0.0 and
    is counted in :attr:`failed`).

    Args:
        store: the trace store the runners work on.
        name: the prompt's resource name.
        max_rollouts: the budget; an evaluation that would exceed it is refused (:attr:`exhausted`).
        feedback: per-example feedback for the reflection LM (default :func:`label_feedback`).
        agent: ``Rollout.agent`` of the rollouts (for runners that claim one agent's rollouts).
        timeout_s: wall-clock limit per rollout attempt, seconds; ``wait_timeout_s``: per evaluation.
        check: called while waiting (e.g. ``runner.check_workers``); may raise to stop.
        progress: a ``rich.progress.Progress`` and its task id to advance by rollouts, or ``None``.
        run_id: tag stored in the rollouts' metadata (``prompt_opt``) and the versions' metadata.
    """

    #: GEPA's optional hook; ``None``: GEPA proposes through the reflection LM.
    propose_new_texts: ProposalFn | None = None

    def __init__(
        self,
        store: TraceStore,
        name: str,
        max_rollouts: int,
        *,
        feedback: Feedback | None = None,
        agent: str = "",
        timeout_s: float = 120.0,
        wait_timeout_s: float = 1800.0,
        check: Callable[[], None] | None = None,
        progress: tuple[Progress, Any] | None = None,
        run_id: str | None = None,
    ) -> None:
        self.store, self.name, self.max_rollouts = store, name, max_rollouts
        self.feedback = feedback or label_feedback()
        self.agent, self.timeout_s, self.wait_timeout_s, self.check = agent, timeout_s, wait_timeout_s, check
        self.progress, self.run_id = progress, run_id or new_id("popt")
        self.used = self.extra = self.failed = 0
        self.exhausted = False
        self.error: BaseException | None = None
        self.versions: dict[str, int] = {}
        for version in list_prompts(store, name):
            self.versions.setdefault(str(version.payload.get("template", "")), version.version)
        self.evaluations: dict[int, list[float]] = {}

    def version_for(self, template: str) -> int:
        """The version holding ``template``: an existing one, else a new unactivated one."""
        if template not in self.versions:
            meta = {"source": "prompt_opt", "run_id": self.run_id}
            self.versions[template] = publish_prompt(
                self.store, self.name, template, activate=False, metadata=meta
            ).version
        return self.versions[template]

    def run(self, tasks: Sequence[Task], version: int, *, budget: bool = True) -> list[dict[str, Any]]:
        """Run one rollout per task pinned to ``version``; returns per-task outputs (see :meth:`evaluate`).

        Args:
            budget: count the rollouts against :attr:`max_rollouts` (refusing when they would exceed it).

        Raises:
            RunError: the budget is spent (``budget=True``), or the runners failed.
            RolloutTimeout: the rollouts did not finish within ``wait_timeout_s``.
        """
        if budget and self.used + len(tasks) > self.max_rollouts:
            self.exhausted = True
            raise RunError(
                f"rollout budget spent: {self.used} used, {len(tasks)} more would exceed {self.max_rollouts}"
            )
        try:
            rollouts = enqueue_tasks(
                self.store,
                tasks,
                resources={self.name: str(version)},
                agent=self.agent,
                max_attempts=2,
                timeout_s=self.timeout_s,
                metadata={"prompt_opt": self.run_id, "prompt_version": version},
            )
            done = wait_for_rollouts(
                self.store, [r.rollout_id for r in rollouts], self.wait_timeout_s, check=self.check
            )
        except Exception as exc:
            self.error = exc
            raise
        if budget:
            self.used += len(tasks)
        else:
            self.extra += len(tasks)
        if self.progress is not None:
            self.progress[0].advance(self.progress[1], len(tasks))
        return [self._output(rollout.rollout_id, rollout.state) for rollout in done]

    def _output(self, rollout_id: str, state: RolloutState) -> dict[str, Any]:
        reward = self.store.final_reward(rollout_id)
        value = reward.value if reward is not None and state is RolloutState.succeeded else None
        self.failed += 0 if value is not None else 1
        spans = self.store.list_spans(rollout_id=rollout_id, kind=SpanKind.llm, valid_only=True)
        text = "\n".join(s.llm.response_text for s in spans if s.llm is not None)
        return {
            "rollout_id": rollout_id,
            "state": state.value,
            "output": text,
            "score": float(value) if value is not None else 0.0,
        }

    # --- the GEPAAdapter protocol -------------------------------------------------------------------
    def evaluate(
        self, batch: list[Task], candidate: dict[str, str], capture_traces: bool = False
    ) -> EvaluationBatch:
        """Score ``candidate`` on ``batch`` with real rollouts (GEPA's ``evaluate``).

        Returns:
            ``EvaluationBatch(outputs, scores, trajectories)``: one output dict per task
            (``rollout_id``, ``state``, ``output`` = the LLM spans' text, ``score``); trajectories add the task.

        Raises:
            RunError: the budget is spent or the runners failed (GEPA stops; see :func:`optimize_prompt`).
        """
        from gepa.core.adapter import EvaluationBatch

        version = self.version_for(candidate[self.name])
        outputs = self.run(batch, version)
        scores = [o["score"] for o in outputs]
        self.evaluations.setdefault(version, []).extend(scores)
        trajectories = (
            [{**o, "task": t} for o, t in zip(outputs, batch, strict=True)] if capture_traces else None
        )
        return EvaluationBatch(outputs=outputs, scores=scores, trajectories=trajectories)

    def make_reflective_dataset(
        self, candidate: dict[str, str], eval_batch: EvaluationBatch, components_to_update: list[str]
    ) -> dict[str, list[dict[str, Any]]]:
        """Per example: the input message, the model's output (from its LLM span) and the feedback."""
        records = [
            {
                "Input": str(t["task"].input.get("text", t["task"].input)),
                "Output": t["output"].strip() or "(empty)",
                "Feedback": self.feedback(t["task"], t["output"], t["score"]),
            }
            for t in eval_batch.trajectories or []
        ]
        return {name: records for name in components_to_update}


def evaluate_prompt(adapter: RolloutPromptAdapter, tasks: Sequence[Task], version: int) -> float:
    """Mean final reward of ``version`` over ``tasks`` (rollouts outside the optimisation budget)."""
    scores = _scores(adapter, tasks, version)
    return sum(scores) / max(len(scores), 1)


def _scores(adapter: RolloutPromptAdapter, tasks: Sequence[Task], version: int) -> list[float]:
    """Per-task final rewards of ``version`` over ``tasks``, in task order (outside the budget)."""
    return [o["score"] for o in adapter.run(tasks, version, budget=False)]


class _Log:
    """A quiet gepa logger: keeps GEPA's messages for the result instead of printing them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, message: str) -> None:
        self.lines.append(message)


def optimize_prompt(
    store: TraceStore,
    name: str,
    seed_prompt: str,
    trainset: Sequence[Task],
    valset: Sequence[Task],
    *,
    reflection: ReflectionLM,
    max_rollouts: int = 300,
    testset: Sequence[Task] | None = None,
    feedback: Feedback | None = None,
    minibatch_size: int = 3,
    use_merge: bool = False,
    seed: int = 0,
    agent: str = "",
    rollout_timeout_s: float = 120.0,
    check: Callable[[], None] | None = None,
    show_progress: bool = True,
    min_gain: float = 0.0,
    max_p: float | None = None,
    promoter: PromptPromoter | None = None,
) -> PromptOptResult:
    """Optimise prompt ``name`` with GEPA over real rollouts; activate the winner only if it is better.

    The seed is the existing version with the same text (or version 1, activated, in an empty store; or a
    new unactivated version). Candidates are evaluated through pinned, unactivated versions, so live
    traffic is untouched while optimising. The winner (best validation mean) is compared with the seed on
    ``testset`` and activated only if its mean is higher by more than ``min_gain`` and, with ``max_p``, a
    one-sided paired test on the same examples (:func:`paired_test`) gives ``p <= max_p``; otherwise the active
    version is left as it was. Without ``testset`` nothing is activated: the comparison runs on the validation
    scores and is reported, but those scores chose the winner among every candidate, so a candidate that fits
    the validation tasks by chance or by construction would pass them (the winner's curse). This is the
    promotion gate's eval rule (:class:`agentforge.gate.EvalGate`); its decision, with the scores and the
    test, is stored as a ``promotion:{name}`` record (:func:`agentforge.gate.list_decisions`).

    Args:
        store: the trace store; runners executing an agent that reads ``ctx.prompt(name)`` must work on it.
        name: the prompt's resource name, e.g. ``prompt:triage``.
        seed_prompt: the starting template.
        trainset: tasks for reflection minibatches (task metadata feeds ``feedback``).
        valset: tasks for GEPA's candidate selection (every accepted candidate runs on all of them).
        reflection: the reflection LM (its ``calls`` record what it proposed).
        max_rollouts: the optimisation budget in rollouts (GEPA's ``max_metric_calls``), never exceeded.
        testset: held-out tasks to decide on publishing (seed and winner, outside the budget); ``None``:
            the winner is reported, never activated.
        feedback: per-example feedback (default :func:`label_feedback` without a vocabulary).
        minibatch_size: reflection minibatch size (GEPA's default 3).
        use_merge: also propose merges of Pareto-front candidates (GEPA's system-aware merge).
        seed: GEPA's random seed.
        agent: ``Rollout.agent`` of the rollouts.
        rollout_timeout_s: limit per rollout attempt, seconds.
        check: called while waiting for rollouts (e.g. ``runner.check_workers``).
        show_progress: show a rich progress bar over the budget.
        min_gain: the winner must beat the seed by more than this (mean reward); 0.0: strictly better.
            On small sets one example decides a 0.0 gain; e.g. 0.02 on 150 messages asks for 4 more right.
        max_p: also require the paired test of winner against seed to reach this one-sided p-value (e.g.
            0.05); ``None`` (default): no significance test is required (it is still computed and reported).
        promoter: a winner that passed the held-out gate then goes through this promoter's traffic canary
            and post-activation watch (:class:`~agentforge.trainers.prompt_promote.PromptPromoter`, on live
            rollouts) instead of being activated at once; ``None``: activated at once.

    Returns:
        The candidates with their validation (and test) scores, what was activated, and the budget used.

    Raises:
        ConfigError: the budget cannot cover the seed's validation run plus one iteration, or ``max_p``
            is outside (0, 1].
        MissingExtraError: ``gepa`` is not installed.
        RunError, RolloutTimeout: the runners failed or rollouts did not finish.
    """
    try:
        from gepa.api import optimize
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("gepa", "train", "optimize_prompt") from exc
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    floor = len(valset) + 2 * minibatch_size
    if max_p is not None and not 0.0 < max_p <= 1.0:
        raise ConfigError(f"optimize_prompt: max_p={max_p} must be in (0, 1] (or None for no test)")
    if max_rollouts < floor or not trainset or not valset:
        raise ConfigError(
            f"optimize_prompt: max_rollouts={max_rollouts} must cover the seed's validation run plus one "
            f"iteration ({len(valset)} + 2 x {minibatch_size} = {floor}); trainset ({len(trainset)}) and "
            f"valset ({len(valset)}) must not be empty"
        )
    t0 = time.monotonic()
    if not list_prompts(store, name):  # an empty store: the seed becomes version 1, active
        publish_prompt(store, name, seed_prompt, activate=True, metadata={"source": "seed"})
    progress = Progress(
        TextColumn("[bold]GEPA[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not show_progress,
    )
    bar = progress.add_task("rollouts", total=max_rollouts)
    adapter = RolloutPromptAdapter(
        store,
        name,
        max_rollouts,
        feedback=feedback,
        agent=agent,
        timeout_s=rollout_timeout_s,
        check=check,
        progress=(progress, bar),
    )
    seed_v = adapter.version_for(seed_prompt)
    log, first_call = _Log(), len(reflection.calls)
    with progress:
        result = optimize(
            seed_candidate={name: seed_prompt},
            trainset=list(trainset),
            valset=list(valset),
            adapter=adapter,
            reflection_lm=reflection,
            reflection_prompt_template=reflection.template,
            reflection_minibatch_size=minibatch_size,
            max_metric_calls=max_rollouts,
            stop_callbacks=[lambda gepa_state: adapter.exhausted or adapter.error is not None],
            use_merge=use_merge,
            seed=seed,
            logger=log,
            raise_on_exception=False,
            display_progress_bar=False,
        )
    if adapter.error is not None:
        raise adapter.error
    candidates = [
        PromptCandidate(
            index=i,
            version=adapter.version_for(c[name]),
            template=c[name],
            val_score=result.val_aggregate_scores[i],
            parents=[p for p in result.parents[i] if p is not None],
            discovered_at=result.discovery_eval_counts[i],
        )
        for i, c in enumerate(result.candidates)
    ]
    best, seed_cand = candidates[result.best_idx], candidates[0]
    significance: PairedTest | None = None
    if testset:
        before = _scores(adapter, testset, seed_cand.version)
        after = before if best is seed_cand else _scores(adapter, testset, best.version)
        seed_cand.test_score, best.test_score = sum(before) / len(before), sum(after) / len(after)
        basis = "test"
    else:
        ids = sorted(set(result.val_subscores[0]) & set(result.val_subscores[best.index]))
        before = [result.val_subscores[0][i] for i in ids]
        after = [result.val_subscores[best.index][i] for i in ids]
        basis = "val"  # the gate's gain is over these paired examples (GEPA scores every candidate on all)
    better = False
    if best is not seed_cand and before:  # the promotion gate's eval rule decides (agentforge.gate)
        seed_ref, best_ref = str(Version(name, seed_cand.version)), str(Version(name, best.version))
        verdict = EvalGate(max_p=max_p, min_gain=min_gain).judge(before, after, seed=seed)
        significance, better = verdict.test, verdict.passed and basis == "test"
        reason = verdict.reason
        if verdict.passed and basis == "val":  # the scores that chose the winner cannot also judge it
            reason = f"{reason}; not activated: {VAL_ONLY}"
        evidence = {
            **verdict.evidence(),
            "live_scores": before,
            "candidate_scores": after,
            "basis": basis,
            "max_p": max_p,
            "min_gain": min_gain,
        }
        record_decision(
            store,
            Decision(
                name,
                "eval",
                "passed" if better else "refused",
                best_ref,
                seed_ref,
                f"{basis} set: {reason}",
                evidence,
            ),
        )
        if better and promoter is not None:  # the canary on live traffic decides the rest (and records it)
            live_v = next((r.version for r in list_prompts(store, name) if r.active), seed_cand.version)
            better = promoter.promote(best.version, live=live_v) == best.version
        elif better:
            store.activate_resource(name, best.version)
            record_decision(
                store,
                Decision(
                    name,
                    "promote",
                    "promoted",
                    best_ref,
                    seed_ref,
                    f"{best_ref} is the active prompt (was {seed_ref})",
                ),
            )
    return PromptOptResult(
        name=name,
        seed_version=seed_v,
        candidates=candidates,
        best_index=best.index,
        activated_version=best.version if better else None,
        decided_on=basis,
        budget=max_rollouts,
        rollouts_used=adapter.used,
        extra_rollouts=adapter.extra,
        failed_rollouts=adapter.failed,
        evaluated={v: (len(s), sum(s) / len(s)) for v, s in adapter.evaluations.items()},
        templates={v: t for t, v in adapter.versions.items() if v in adapter.evaluations},
        reflection_calls=reflection.calls[first_call:],
        gepa_log=log.lines,
        wall_s=time.monotonic() - t0,
        significance=significance,
        max_p=max_p,
    )
