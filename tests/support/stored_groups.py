"""A :class:`~agentforge.trainers.grpo_trainer.LightningTrainer` over GRPO groups already in a store (offline
GRPO's ``StoredGroupSource``) on the tiny model, with a publisher that only records: real TRL steps in seconds,
no runner, gateway or engine."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tiny_model import PROMPT, tiny_model

from agentforge.ports import TraceStore
from agentforge.trainers.replay.select import TraceFilter, select_traces
from agentforge.types import LLMCall, Reward, Rollout, RolloutState, Span, SpanKind, Task

__all__ = [
    "RecordingPublisher",
    "own_logprobs",
    "store_rollout",
    "stored_group_trainer",
    "tiny_train_config",
    "train_on_finished_groups",
]


def store_rollout(
    store: TraceStore,
    agent: str,
    group: str,
    completion: list[int],
    reward: float,
    logprobs: list[float],
    **span_kw: Any,
) -> None:
    """Store one finished rollout of ``agent`` in group ``group``: one LLM span ``PROMPT`` → ``completion`` with
    the stored ``logprobs`` (served by ``policy@v0``; ``flags`` and ``attributes`` in ``span_kw``) and its final
    ``reward``."""
    rollout = store.enqueue_rollout(Rollout(agent=agent, group_id=group, task=Task(task_id=group, input={})))
    store.update_rollout(rollout.rollout_id, state=RolloutState.running)
    call = LLMCall(
        version="policy@v0",
        prompt_token_ids=PROMPT,
        completion_token_ids=completion,
        logprobs=logprobs,
        finish_reason="stop",
        flags=list(span_kw.pop("flags", [])),
    )
    store.add_span(Span(kind=SpanKind.llm, rollout_id=rollout.rollout_id, name="llm", llm=call, **span_kw))
    store.add_reward(Reward(rollout_id=rollout.rollout_id, value=reward, final=True))
    store.update_rollout(rollout.rollout_id, state=RolloutState.succeeded)


def own_logprobs(completion: list[int]) -> list[float]:
    """The tiny model's log-probabilities of ``completion`` after :data:`tiny_model.PROMPT`, shape ``(C,)`` (what
    a fresh LoRA recomputes, so stored ones equal to these give importance ratios of 1)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model())
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + completion])).logits[0, len(PROMPT) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


class RecordingPublisher:
    """Serves ``policy@v{n}`` after ``n`` publishes; records each published adapter folder."""

    def __init__(self) -> None:
        self.dirs: list[Path] = []

    def current(self) -> str:
        return f"policy@v{len(self.dirs)}"

    def publish(self, adapter_dir: Path, step: int) -> str:
        self.dirs.append(Path(adapter_dir))
        return self.current()


def record_scored_batches(trainer: Any) -> list[dict[str, Any]]:
    """Record what TRL's ``_generate_and_score_completions`` returns (advantages, masks) on ``trainer``
    (a :class:`~agentforge.trainers.grpo_trainer.LightningTrainer`): the returned list fills as it trains."""
    seen: list[dict[str, Any]] = []
    score = trainer.trainer._generate_and_score_completions

    def recording(*args: Any, **kwargs: Any) -> dict[str, Any]:
        out = score(*args, **kwargs)
        seen.append(out)
        return out

    trainer.trainer._generate_and_score_completions = recording
    return seen


def stored_group_trainer(
    out: Path, store: TraceStore, agent: str, group_size: int = 2, **config_kw: Any
) -> tuple[Any, RecordingPublisher]:
    """A trainer on ``agent``'s stored groups: one group per step, one step, a publish after it.

    Args:
        out: the run's ``output_dir``.
        store: holds the scored rollouts (e.g. :func:`tiny_model.scored_rollout`).
        agent: whose rollouts to train on.
        group_size: ``G``.
        **config_kw: :class:`~agentforge.trainers.grpo_config.TrainConfig` fields overriding the defaults here.

    Returns:
        ``(LightningTrainer, RecordingPublisher)``.
    """
    from agentforge.trainers.grpo_trainer import LightningTrainer
    from agentforge.trainers.replay.grpo import StoredGroupSource

    groups = select_traces(store, TraceFilter(agent=agent, require_reward=False)).groups()
    config = tiny_train_config(out, num_generations=group_size, **config_kw)
    publisher = RecordingPublisher()
    source = StoredGroupSource(groups, group_size)
    return LightningTrainer(tiny_model(), store, None, config, publisher, source=source), publisher


def tiny_train_config(out: Path, **changes: Any) -> Any:
    """The tiny model's :class:`~agentforge.trainers.grpo_config.TrainConfig` in ``out``: one step of one group
    of 2, lr 1e-2, LoRA r 4, float32 on the CPU, no saving or reporting, seed 0; ``changes`` override."""
    from agentforge.trainers.grpo_config import TrainConfig

    fields: dict[str, Any] = dict(
        output_dir=str(out),
        num_generations=2,
        tasks_per_step=1,
        max_steps=1,
        swap_every=1,
        learning_rate=1e-2,
        lora_r=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        gradient_checkpointing=False,
    )
    return TrainConfig(**{**fields, **changes})


def train_on_finished_groups(
    store: TraceStore,
    members: Mapping[str, Sequence[Any]],
    finish: Callable[[Rollout, Any], None],
    out: Path,
    current: str = "policy@v1",
    **config_kw: Any,
) -> tuple[Any, Any, list[Rollout], dict[str, Any]]:
    """One real TRL step of the live :class:`~agentforge.trainers.rollouts.RolloutSource` over groups of 4
    finished rollouts, one group per task of ``members`` (2 tasks a step, lr 1e-3, unshuffled).

    Args:
        store: holds the rollouts.
        members: task id → its 4 members, in order; ``finish(rollout, member)`` finishes each rollout.
        finish: claims the rollout and stores its spans, reward and attempt state.
        out: the run's ``output_dir``.
        current: the version the source serves (older spans are stale).
        **config_kw: further :class:`~agentforge.trainers.grpo_config.TrainConfig` fields.

    Returns:
        ``(trainer, source, formed rollouts in batch order, what _generate_and_score_completions returned)``.
    """
    from agentforge.trainers.grpo_trainer import LightningTrainer
    from agentforge.trainers.rollouts import RolloutSource

    tasks = {t: Task(task_id=t) for t in members}
    source = RolloutSource(store, tasks, 4, lambda: current, max_staleness=1, max_attempts=1, poll_s=0.01)
    formed = source.enqueue([t for t in members for _ in range(4)])
    for rollout, member in zip(formed, [m for t in members for m in members[t]], strict=True):
        finish(rollout, member)
    by_task = {t: [r for r in formed if r.task.task_id == t] for t in members}
    source.enqueue = lambda prompts: [by_task[p][i % 4] for i, p in enumerate(prompts)]  # type: ignore[method-assign]
    fields = dict(num_generations=4, tasks_per_step=2, learning_rate=1e-3, shuffle_dataset=False)
    config = tiny_train_config(out, **{**fields, **config_kw})
    trainer = LightningTrainer(tiny_model(), store, None, config, RecordingPublisher(), source=source)
    seen = record_scored_batches(trainer)
    trainer.train()
    (scored,) = seen
    return trainer, source, formed, scored
