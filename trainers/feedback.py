"""The continual trainer's sample source: the openings of conversations users rated, re-run as GRPO groups.

:class:`FeedbackSource` is the :class:`~agentforge.ports.SampleSource` of
:class:`~agentforge.trainers.continual.ContinualTrainer` (its module docstring tells the whole loop). Its
cursor over the rated conversations lives in the store, on each conversation's rollout:
``metadata["continual"] = {"run", "step"}`` when the conversation is reserved for a step (its opening's group
is enqueued), plus ``"trained": true`` once that optimizer step has finished. A conversation with a mark is
never reserved again; after a restart (``kill -9``, a crash) with the same ``output_dir`` (so the same run
id), the conversations this run reserved for the step it resumes at are re-run by that step first, and the
inner :class:`~agentforge.trainers.rollouts.RolloutSource` trains the re-runs it had already formed for them:
none is lost, none trained by two steps.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from agentforge.ports import BatchReport, TraceStore
from agentforge.trainers.rollouts import RolloutSource
from agentforge.types import Rollout, SpanKind, Task

__all__ = ["APP_AGENT", "FeedbackSource", "Opening", "Stopped", "feedback_reward", "word_f1"]

logger = logging.getLogger("agentforge.continual")

#: The agent name of the app's conversations (``examples/app/service.py``'s ``AGENT``).
APP_AGENT = "app:customer-service"

RewardFn = Callable[[str, str, float], "float | None"]


class Stopped(Exception):
    """Raised inside the sample source when :meth:`ContinualTrainer.stop` was called; ends ``run``."""


def word_f1(a: str, b: str) -> float:
    """Word-level F1 overlap of two texts in [0, 1] (SQuAD's metric; lower-cased ``\\w+`` tokens)."""
    ta, tb = re.findall(r"\w+", a.lower()), re.findall(r"\w+", b.lower())
    if not ta or not tb:
        return float(ta == tb)
    common = sum((Counter(ta) & Counter(tb)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(ta), common / len(tb)
    return 2 * precision * recall / (precision + recall)


def feedback_reward(reply: str, reference: str, feedback: float) -> float | None:
    """Reward in [0, 1] for a re-run ``reply`` given the rated ``reference`` reply and its ``feedback``.

    Returns:
        ``word_f1`` for positive feedback, ``1 - word_f1`` for negative, ``None`` (masked) for 0.
    """
    if feedback == 0:
        return None
    sim = word_f1(reply, reference)
    return sim if feedback > 0 else 1.0 - sim


def _render(text: str | None, tool_calls: Sequence[Any]) -> str:
    """An answer as one string: its text, then each tool call as ``name(arguments)``."""
    calls = [f"{c.name}({c.arguments})" for c in tool_calls]
    return " ".join([text or "", *calls]).strip()


class Opening:
    """A rated conversation's opening call, as stored (see the module docstring)."""

    def __init__(self, rollout: Rollout, request: dict[str, Any], reference: str, feedback: float) -> None:
        self.rollout, self.request, self.reference, self.feedback = rollout, request, reference, feedback

    def task(self, alias: str, temperature: float) -> Task:
        """The replay task: the opening's messages, tools and ``tool_choice``, the rated reply and its feedback."""
        return Task(
            task_id=f"opening-{self.rollout.rollout_id}",
            input={
                "messages": self.request.get("messages", []),
                "tools": self.request.get("tools"),
                "max_tokens": self.request.get("max_tokens"),
                "tool_choice": self.request.get("tool_choice"),
                "model": alias,
                "temperature": temperature,
                "reference": self.reference,
                "feedback": self.feedback,
            },
            metadata={"conversation": self.rollout.rollout_id},
        )


class FeedbackSource:
    """:class:`~agentforge.ports.SampleSource` of the continual trainer (runs on the main rank).

    Each call waits until ``tasks_per_step`` rated, unused conversations exist, marks them used, re-runs
    their openings as groups (through an inner :class:`RolloutSource`) and returns the samples.

    Args:
        store: the store the app and the gateway write to.
        rollouts: the inner source (its ``tasks`` dict receives the replay tasks).
        tasks_per_step: conversations per call.
        stop: set to end the run; checked at every poll.
        app_agent: the app's agent name; poll_s: seconds between polls; temperature: replay sampling.
        max_age_s: ignore conversations created longer ago than this (``None``: any age).

    With a tenant on the inner source (``RolloutSource(tenant=...)``) only that tenant's conversations are read,
    and the re-runs are that tenant's rollouts.
    """

    def __init__(
        self,
        store: TraceStore,
        rollouts: RolloutSource,
        tasks_per_step: int,
        stop: threading.Event,
        *,
        app_agent: str = APP_AGENT,
        poll_s: float = 2.0,
        temperature: float = 1.0,
        max_age_s: float | None = None,
    ) -> None:
        self.store, self.inner, self.tasks_per_step, self.stop = store, rollouts, tasks_per_step, stop
        self.app_agent, self.poll_s = app_agent, poll_s
        self.temperature, self.max_age_s = temperature, max_age_s
        self.used: list[str] = []
        self.skipped: Counter[str] = Counter()
        self._batch: list[Opening] = []  # the last batch's conversations, until mark_trained
        self._earlier: dict[int, list[Opening]] | None = None  # reserved before a restart, by step
        self._marked_here: set[str] = set()  # conversations this instance marked (not a restart's to resume)

    @property
    def run_id(self) -> str:
        """The inner source's run id (on the re-runs and on the marks)."""
        return self.inner.run_id

    @run_id.setter
    def run_id(self, value: str) -> None:
        self.inner.run_id = value

    @property
    def reports(self) -> list[BatchReport]:
        """The inner source's batch reports."""
        return self.inner.reports

    def prompts(self) -> list[str]:
        """Placeholder slots, one per group of a step (the groups come from the store, not the dataset)."""
        return [f"slot-{i}" for i in range(self.tasks_per_step)]

    def pending(self) -> list[Opening]:
        """Rated conversations not yet used, oldest first (conversations without a usable opening are
        marked used and counted in :attr:`skipped`)."""
        since = None if self.max_age_s is None else time.time() - self.max_age_s
        out = []
        for rollout in self.store.list_rollouts(agent=self.app_agent, since=since, tenant=self.inner.tenant):
            if "continual" in rollout.metadata:
                continue
            reward = self.store.final_reward(rollout.rollout_id)
            if reward is None or reward.source != "user_feedback" or not reward.value:
                continue
            opening = self._opening(rollout, float(reward.value))
            if opening is None:
                self.skipped["no opening call"] += 1
                self._mark(rollout, step=-1)
                continue
            out.append(opening)
        return out

    def _opening(self, rollout: Rollout, feedback: float) -> Opening | None:
        spans = self.store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm, valid_only=True)
        spans = [s for s in spans if s.llm is not None and s.llm.request.get("messages")]
        if not spans:
            return None
        first = min(spans, key=lambda s: (s.sequence if s.sequence is not None else 0, s.started_at))
        assert first.llm is not None
        reference = _render(first.llm.response_text, first.llm.tool_calls)
        return Opening(rollout, first.llm.request, reference, feedback)

    def _mark(self, rollout: Rollout, step: int, trained: bool = False) -> None:
        latest = self.store.get_rollout(rollout.rollout_id)
        mark = {"run": self.run_id, "step": step, **({"trained": True} if trained else {})}
        self._marked_here.add(rollout.rollout_id)
        self.store.update_rollout(rollout.rollout_id, metadata={**latest.metadata, "continual": mark})

    def reserved_earlier(self, step: int) -> list[Opening]:
        """The conversations this run reserved for ``step`` before this process started, oldest first.

        The store is read once per process (at the first batch); afterwards every reservation is made here.
        """
        if self._earlier is None:
            self._earlier = {}
            for rollout in self.store.list_rollouts(agent=self.app_agent, tenant=self.inner.tenant):
                mark = rollout.metadata.get("continual")
                if not isinstance(mark, dict) or mark.get("run") != self.run_id or mark.get("trained"):
                    continue
                if rollout.rollout_id in self._marked_here:
                    continue
                reward = self.store.final_reward(rollout.rollout_id)
                opening = self._opening(rollout, float(reward.value)) if reward and reward.value else None
                if opening is not None and isinstance(mark.get("step"), int) and mark["step"] >= 0:
                    self._earlier.setdefault(mark["step"], []).append(opening)
        return self._earlier.pop(step, [])

    def mark_trained(self, step: int) -> None:
        """Record that optimizer step ``step`` trained on the last batch: its conversations and re-runs."""
        for opening in self._batch:
            self._mark(opening.rollout, step, trained=True)
        self._batch = []
        self.inner.mark_trained(step)

    def __call__(self, prompts: Sequence[Any], trainer: Any = None) -> dict[str, list[Any]]:
        """Wait for rated conversations, re-run their openings, return the samples (TRL's layout).

        After a restart the conversations this run reserved for the step come first (their re-runs too, by
        the inner source's cursor), so a batch a crash interrupted is trained, once, by its own step.

        Raises:
            Stopped: :attr:`stop` was set while waiting.
        """
        step = int(trainer.state.global_step) if trainer is not None else self.inner.step
        if self.stop.is_set():
            raise Stopped
        openings = self.reserved_earlier(step)[: self.tasks_per_step]
        while len(openings) < self.tasks_per_step:
            if self.stop.is_set():
                raise Stopped
            fresh = self.pending()[: self.tasks_per_step - len(openings)]
            if len(openings) + len(fresh) == self.tasks_per_step:
                openings += fresh
                break
            self.stop.wait(self.poll_s)
        ids = []
        for opening in openings:
            task = opening.task(self.inner.alias, self.temperature)
            self.inner.tasks[task.task_id] = task
            ids += [task.task_id] * self.inner.group_size
            self._mark(opening.rollout, step)
            self.used.append(opening.rollout.rollout_id)
        self._batch = list(openings)
        logger.info("step %d: re-running %d rated conversation openings", step, len(openings))
        return self.inner(ids, trainer)
