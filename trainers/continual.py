"""Continual training behind a live app: learn from conversations users rated, hot-swap, never restart it.

The app (``examples/app/service.py``) stores every conversation as a rollout of agent
``app:customer-service`` and a user's thumbs up/down as its final reward (source ``user_feedback``). The
:class:`ContinualTrainer` runs next to it:

1. **Poll** the store every ``poll_s`` seconds for the app's rollouts whose final reward came from user
   feedback (non-zero) and that no continual run has used yet (``metadata["continual"]`` unset).
2. **Opening.** A conversation's opening is the request of its first LLM span, exactly as the gateway
   recorded it: the messages (system prompt, the app's worked examples, the first user message) and the
   tool schemas. The *rated reply* is that call's answer (text, plus tool calls rendered as
   ``name(arguments)``). The conversation is marked reserved (``metadata["continual"] = {"run", "step"}``)
   the moment its group is enqueued and ``trained`` once the optimizer step is done, so none is used twice;
   a run resumed after a crash (``run(resume_from_checkpoint=True)``, same ``output_dir``) trains the
   conversations reserved for the step it resumes at first, so none is lost either
   (:mod:`agentforge.trainers.feedback`).
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
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentforge.errors import UserError
from agentforge.ports import AdapterPublisher, TraceStore
from agentforge.trainers.feedback import (
    APP_AGENT,
    FeedbackSource,
    Opening,
    RewardFn,
    Stopped,
    _render,
    feedback_reward,
    word_f1,
)
from agentforge.trainers.grpo_config import TrainConfig
from agentforge.trainers.progress import show_progress
from agentforge.trainers.rollouts import RolloutSource
from agentforge.types import Task

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

#: The agent name of the re-runs this trainer enqueues (its own runners claim only these).
REPLAY_AGENT = "continual:replay"


def _replay_call(task: Task, ctx: Any) -> str:
    """Send the stored opening in ``task.input`` through the gateway once; the answer as one string."""
    inp = task.input
    extra = {"tools": inp["tools"]} if inp.get("tools") else {}
    if inp.get("tool_choice") is not None:  # as the opening was sent (e.g. "required": a forced call)
        extra["tool_choice"] = inp["tool_choice"]
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

    ``task.input`` holds ``messages``, ``tools``, ``tool_choice``, ``model`` (the alias), ``max_tokens``, ``temperature``,
    ``reference`` (the rated reply) and ``feedback`` (its score), see :meth:`Opening.task`.

    Returns:
        ``reward_fn(answer, reference, feedback)``; the runner stores it as the rollout's final reward.
    """
    answer = _replay_call(task, ctx)
    return reward_fn(answer, task.input["reference"], float(task.input["feedback"]))


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
        tenant: learn one tenant's adapter from that tenant's conversations only (its rated rollouts, its
            re-runs); pair it with a publisher of the tenant's lineage, e.g. ``StorePublisher(store,
            alias="policy@acme")``, so the versions it publishes are ``policy@acme/vN``, or, next to the gateway,
            the tenant's promotion gate ``GatedPublisher(TenantLineage(adapters, store, "acme"), store, evaluate=...,
            canary=..., rollback=...)`` (its canary serves a share of acme's live conversations only; a live reward
            drop after promotion rolls acme back). ``None``: no tenant.
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
        tenant: str | None = None,
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
            tenant=tenant,
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

    def run(
        self, max_steps: int | None = None, resume_from_checkpoint: bool | str | None = None
    ) -> dict[str, Any]:
        """Train until ``max_steps`` optimizer steps are done or :meth:`stop` is called.

        Args:
            max_steps: steps to take in all, counting those of the run being resumed (``None``: until stopped).
            resume_from_checkpoint: as :meth:`LightningTrainer.train` (``True``: the last checkpoint in
                ``config.output_dir``; the conversation cursor continues from the store).

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
            self.lightning.train(resume_from_checkpoint=resume_from_checkpoint)
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
