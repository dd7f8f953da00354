"""Continual training behind a live app: learn from conversations users rated, hot-swap, never restart it.

The app (``examples/app/service.py``) stores every conversation as a rollout of agent
``app:customer-service`` and a user's thumbs up/down as its final reward (source ``user_feedback``). The
:class:`ContinualTrainer` runs next to it:

1. **Poll** the store every ``poll_s`` seconds for the app's rollouts whose final reward came from user
   feedback (non-zero) and that no continual run has used yet (``metadata["continual"]`` unset).
2. **Opening.** A conversation's opening is the request of its first LLM span, exactly as the gateway
   recorded it: the messages (system prompt, the app's worked examples, the first user message) and the
   tool schemas. The *rated reply* is that call's answer (text, plus tool calls rendered as
   ``name(arguments)``). The conversation is marked used (``metadata["continual"] = {"run", "step"}``)
   the moment its group is enqueued, so none is trained twice (at most once: a crash after marking
   loses it rather than repeating it).
3. **Re-run** each opening as one GRPO group of ``G`` rollouts (agent :data:`REPLAY_AGENT`) through the
   gateway, pinned to the version serving now, executed by runner threads this trainer starts
   (:func:`replay_opening`, temperature 1.0 so the group explores; the app itself answers greedily).
4. **Reward** each re-run reply against the rated one with :func:`feedback_reward`: ``sim`` for a thumbs
   up, ``1 − sim`` for a thumbs down, where ``sim`` is the word-level F1 overlap used by SQuAD
   (Rajpurkar et al. 2016). GRPO's group-relative advantage then pushes the policy towards answers like
   the ones users liked and away from the ones they disliked. This is a proxy and says so: the feedback
   rates the whole conversation while the reward scores its opening call only, and for a thumbs down it
   rewards *difference*, not quality. Pass ``reward_fn`` to use something stronger (e.g. an LLM judge:
   :class:`agentforge.rewards.judge.GroupJudge` wrapped as ``(reply, reference, feedback) -> float``).
5. **Train and hot-swap** with :class:`~agentforge.trainers.grpo_trainer.LightningTrainer` (one optimizer step
   per ``tasks_per_step`` rated conversations); every ``swap_every`` steps the adapter becomes a new
   version and the gateway's alias moves to it, so the app's next call is served by it.

:meth:`ContinualTrainer.stop` (or SIGINT/SIGTERM while :meth:`~ContinualTrainer.run` runs in the main
thread) ends the run at the next poll; a group already enqueued finishes first. The last trained adapter
is published before ``run`` returns.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentforge.errors import UserError
from agentforge.ports import AdapterPublisher, BatchReport, TraceStore
from agentforge.trainers.grpo_config import TrainConfig
from agentforge.trainers.progress import show_progress
from agentforge.trainers.rollouts import RolloutSource
from agentforge.types import Rollout, SpanKind, Task

__all__ = [
    "APP_AGENT",
    "REPLAY_AGENT",
    "ContinualTrainer",
    "FeedbackSource",
    "Opening",
    "Stopped",
    "feedback_reward",
    "replay_opening",
    "word_f1",
]

logger = logging.getLogger("agentforge.continual")

#: The agent name of the app's conversations (``examples/app/service.py``'s ``AGENT``).
APP_AGENT = "app:customer-service"
#: The agent name of the re-runs this trainer enqueues (its own runners claim only these).
REPLAY_AGENT = "continual:replay"

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


def _replay_call(task: Task, ctx: Any) -> str:
    """Send the stored opening in ``task.input`` through the gateway once; the answer as one string."""
    inp = task.input
    extra = {"tools": inp["tools"]} if inp.get("tools") else {}
    out = ctx.openai_client().chat.completions.create(
        model=inp["model"],
        messages=inp["messages"],
        max_tokens=int(inp.get("max_tokens") or 48),
        temperature=float(inp.get("temperature", 1.0)),
        **extra,
    )
    message = out.choices[0].message
    return _render(message.content, [c.function for c in (message.tool_calls or [])])


def replay_opening(task: Task, ctx: Any, reward_fn: RewardFn = feedback_reward) -> float | None:
    """Runner agent: send a stored opening through the gateway once and score the answer.

    ``task.input`` holds ``messages``, ``tools``, ``model`` (the alias), ``max_tokens``, ``temperature``,
    ``reference`` (the rated reply) and ``feedback`` (its score), see :meth:`Opening.task`.

    Returns:
        ``reward_fn(answer, reference, feedback)``; the runner stores it as the rollout's final reward.
    """
    answer = _replay_call(task, ctx)
    return reward_fn(answer, task.input["reference"], float(task.input["feedback"]))


class Opening:
    """A rated conversation's opening call, as stored (see the module docstring)."""

    def __init__(self, rollout: Rollout, request: dict[str, Any], reference: str, feedback: float) -> None:
        self.rollout, self.request, self.reference, self.feedback = rollout, request, reference, feedback

    def task(self, alias: str, temperature: float) -> Task:
        """The replay task: the opening's messages and tools, the rated reply and its feedback."""
        return Task(
            task_id=f"opening-{self.rollout.rollout_id}",
            input={
                "messages": self.request.get("messages", []),
                "tools": self.request.get("tools"),
                "max_tokens": self.request.get("max_tokens"),
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
        for rollout in self.store.list_rollouts(agent=self.app_agent, since=since):
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

    def _mark(self, rollout: Rollout, step: int) -> None:
        latest = self.store.get_rollout(rollout.rollout_id)
        meta = {**latest.metadata, "continual": {"run": self.run_id, "step": step}}
        self.store.update_rollout(rollout.rollout_id, metadata=meta)

    def __call__(self, prompts: Sequence[Any], trainer: Any = None) -> dict[str, list[Any]]:
        """Wait for rated conversations, re-run their openings, return the samples (TRL's layout).

        Raises:
            Stopped: :attr:`stop` was set while waiting.
        """
        step = int(trainer.state.global_step) if trainer is not None else self.inner.step
        while True:
            if self.stop.is_set():
                raise Stopped
            openings = self.pending()[: self.tasks_per_step]
            if len(openings) == self.tasks_per_step:
                break
            self.stop.wait(self.poll_s)
        ids = []
        for opening in openings:
            task = opening.task(self.inner.alias, self.temperature)
            self.inner.tasks[task.task_id] = task
            ids += [task.task_id] * self.inner.group_size
            self._mark(opening.rollout, step)
            self.used.append(opening.rollout.rollout_id)
        logger.info("step %d: re-running %d rated conversation openings", step, len(openings))
        return self.inner(ids, trainer)


class ContinualTrainer:
    """Trains the policy behind a live app from its rated conversations (module docstring).

    Args:
        model: base checkpoint directory (the one serving loads).
        store: the store the app and the gateway use.
        gateway_url: the gateway's root URL; the replay runners call the policy through it.
        config: :class:`TrainConfig` (``num_generations`` = re-runs per opening, ``tasks_per_step`` =
            conversations per step, ``swap_every``; ``max_steps`` is set by :meth:`run`).
        publisher: publishes each adapter as a new served version (e.g. a ``HotSwapPublisher``).
        app_agent: the app's agent name.
        workers: replay runner threads.
        reward_fn: ``(reply, rated_reply, feedback) -> reward | None``; default :func:`feedback_reward`.
        poll_s: seconds between store polls; temperature: sampling temperature of the re-runs.
        max_age_s: only conversations younger than this many seconds (``None``: any).
        gateway_api_key: the gateway's API key, if any.
    """

    def __init__(
        self,
        model: str | Path,
        store: TraceStore,
        gateway_url: str,
        config: TrainConfig,
        publisher: AdapterPublisher,
        *,
        app_agent: str = APP_AGENT,
        workers: int = 2,
        reward_fn: RewardFn | None = None,
        poll_s: float = 2.0,
        temperature: float = 1.0,
        max_age_s: float | None = None,
        gateway_api_key: str | None = None,
    ) -> None:
        if temperature <= 0:
            raise UserError(f"temperature={temperature}: the re-runs of a group must differ; use > 0")
        self.model, self.store, self.gateway_url = model, store, gateway_url
        self.config, self.publisher, self.workers = config, publisher, workers
        self.reward_fn, self.gateway_api_key = reward_fn, gateway_api_key
        self._stop = threading.Event()
        inner = RolloutSource(
            store,
            {},
            config.num_generations,
            publisher.current,
            alias=config.alias,
            agent=REPLAY_AGENT,
            timeout_s=config.rollout_timeout_s,
            max_attempts=config.rollout_max_attempts,
            wait_timeout_s=config.wait_timeout_s,
            max_staleness=config.max_staleness,
        )
        self.source = FeedbackSource(
            store,
            inner,
            config.tasks_per_step,
            self._stop,
            app_agent=app_agent,
            poll_s=poll_s,
            temperature=temperature,
            max_age_s=max_age_s,
        )
        self.lightning: Any = None  # the LightningTrainer, built by run()

    def stop(self) -> None:
        """Ask :meth:`run` to return at its next poll (thread-safe, idempotent)."""
        self._stop.set()

    def _agent(self) -> Callable[[Task, Any], float | None]:
        reward_fn = self.reward_fn or feedback_reward
        return lambda task, ctx: replay_opening(task, ctx, reward_fn)

    def run(self, max_steps: int | None = None) -> dict[str, Any]:
        """Train until ``max_steps`` optimizer steps are done or :meth:`stop` is called.

        Args:
            max_steps: steps to take (``None``: until stopped).

        Returns:
            ``{"steps", "versions", "history", "conversations"}`` (the conversation ids trained on).

        Raises:
            UserError: called a second time (one run per instance).
            RolloutTimeout: no replay of a step finished within ``wait_timeout_s``.
        """
        from agentforge.runtime import Runner
        from agentforge.trainers.grpo_trainer import LightningTrainer

        self.config.max_steps = max_steps if max_steps is not None else 10**9
        if self.lightning is None:
            self.lightning = LightningTrainer(
                self.model, self.store, None, self.config, self.publisher, source=self.source
            )
        show_progress(self.lightning.trainer, version=self.publisher.current, open_ended=max_steps is None)
        runner = Runner(
            self.store,
            self._agent(),
            self.gateway_url,
            workers=self.workers,
            mode="thread",
            agent_name=REPLAY_AGENT,
            gateway_api_key=self.gateway_api_key,
        ).start()
        restore = self._install_signals()
        try:
            self.lightning.trainer.args.max_steps = self.config.max_steps
            self.lightning.train()
        except Stopped:
            logger.info("continual training stopped after %d steps", self.lightning.trainer.state.global_step)
            self.lightning.maybe_publish(force=True)
        finally:
            restore()
            runner.stop()
        return {
            "steps": int(self.lightning.trainer.state.global_step),
            "versions": list(self.lightning.versions),
            "history": self.lightning.history,
            "conversations": list(self.source.used),
        }

    def _install_signals(self) -> Callable[[], None]:
        """SIGINT/SIGTERM call :meth:`stop` while ``run`` runs in the main thread; returns the undo."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, lambda *_: self.stop())

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore
