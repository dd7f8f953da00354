"""Contract from public bug reports (issue 36, "Parallel branches"): a rollout whose agent holds two conversations
at once (two LangGraph branches, each its own chat) is two trajectories, and the trainer trains both.

A real TRL step on the tiny model over one group that the live :class:`~agentforge.trainers.rollouts.RolloutSource`
formed with ``trajectories_per_rollout=2`` (``num_generations=6``: 3 rollouts × 2 rows):

* rollouts ``A`` (reward 1) and ``B`` (reward 0) each hold two branch conversations, their calls interleaved in
  time (A's branch 1, A's branch 2, A's branch 1 again, ...), so each branch is one trajectory of two calls;
* rollout ``C`` (reward 1) holds one conversation: its second row is a masked placeholder (``fewer_trajectories``).

Each branch's row carries its own tokens with loss mask 1 and the rollout's advantage; with the default
``trajectories_per_rollout=1`` the same rollouts train their last branch only and count the other as an extra
trajectory (the old behaviour, kept as the default for agents with one conversation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from stored_groups import RecordingPublisher, record_scored_batches, tiny_train_config
from tiny_model import PROMPT, tiny_model

from agentforge.errors import ConfigError, UserError
from agentforge.ports import BatchReport
from agentforge.testing import memory_store
from agentforge.trainers.rollouts import RolloutSource
from agentforge.trainers.samples import build_trajectories
from agentforge.types import AttemptState, LLMCall, Reward, Span, SpanKind, Task

CURRENT = "policy@v1"
#: two branch conversations: the same system turn, a different user turn (so neither continues the other)
BRANCH_PROMPTS = ([*PROMPT, 520, 57], [*PROMPT, 520, 1431])
FIRST, SECOND, TOOL = [57, 1431, 2], [1431, 2], [198, 520, 198]


def _call(prompt: list[int], completion: list[int]) -> Span:
    llm = LLMCall(
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-1.0] * len(completion),
        finish_reason="stop",
        version=CURRENT,
    )
    return Span(kind=SpanKind.llm, llm=llm)


def _finish(store: Any, rollout: Any, reward: float, branches: int) -> None:
    """Two calls per branch, the branches' calls interleaved: b1 call 1, b2 call 1, b1 call 2, b2 call 2."""
    claimed, attempt = store.claim_rollout("w")
    assert claimed.rollout_id == rollout.rollout_id
    prompts = BRANCH_PROMPTS[:branches]
    calls = [_call(p, FIRST) for p in prompts] + [_call(p + FIRST + TOOL, SECOND) for p in prompts]
    for span in calls:
        store.add_span(
            span.model_copy(update={"rollout_id": rollout.rollout_id, "attempt_id": attempt.attempt_id})
        )
    store.add_reward(Reward(rollout_id=rollout.rollout_id, value=reward, final=True))
    store.finish_attempt(attempt.attempt_id, AttemptState.succeeded)


def _formed(store: Any, k: int) -> tuple[RolloutSource, list[Any]]:
    source = RolloutSource(
        store, {"t": Task(task_id="t")}, 3 * k, lambda: CURRENT, max_attempts=1, trajectories_per_rollout=k
    )
    formed = source.enqueue(["t"] * 3 * k)
    assert len(formed) == 3  # one rollout per k rows
    for rollout, (reward, branches) in zip(formed, [(1.0, 2), (0.0, 2), (1.0, 1)], strict=True):
        _finish(store, rollout, reward, branches)
    return source, formed


def test_interleaved_branches_are_two_trajectories_of_two_calls_each() -> None:
    store = memory_store()
    _, formed = _formed(store, 2)
    spans = store.list_spans(rollout_id=formed[0].rollout_id, kind=SpanKind.llm)
    trajectories = build_trajectories(spans)
    assert len(trajectories) == 2
    for traj, prompt in zip(trajectories, BRANCH_PROMPTS, strict=True):
        assert traj.prompt_ids == prompt and traj.completion_ids == FIRST + TOOL + SECOND
        assert traj.sampled_tokens == len(FIRST) + len(SECOND)


def test_one_row_per_rollout_trains_only_the_last_branch_and_counts_the_other() -> None:
    store = memory_store()
    source = RolloutSource(store, {"t": Task(task_id="t")}, 3, lambda: CURRENT, max_attempts=1)
    formed = source.enqueue(["t"] * 3)
    for rollout, (reward, branches) in zip(formed, [(1.0, 2), (0.0, 2), (1.0, 1)], strict=True):
        _finish(store, rollout, reward, branches)
    report = BatchReport()
    rows = source.samples(store.list_rollouts(), report)
    assert [p[-1] for p in rows["prompt_ids"]] == [1431, 1431, 57]  # the last branch of A and B
    assert report.extra_trajectories == 2 and report.split_rollouts == 2


@pytest.mark.slow
def test_the_trainer_trains_both_branches_with_the_rollouts_advantage(tmp_path: Path) -> None:
    import torch

    from agentforge.trainers.grpo_trainer import LightningTrainer

    store = memory_store()
    source, formed = _formed(store, 2)
    source.enqueue = lambda prompts: formed  # type: ignore[method-assign]
    config = tiny_train_config(
        tmp_path / "run",
        num_generations=6,
        trajectories_per_rollout=2,
        learning_rate=1e-3,
        shuffle_dataset=False,
    )
    trainer = LightningTrainer(
        tiny_model(), store, [Task(task_id="t")], config, RecordingPublisher(), source=source
    )
    seen = record_scored_batches(trainer)
    trainer.train()

    (out,) = seen
    valid = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0])  # A's two rows, B's two, C's one real row
    a = (1.0 - valid.mean()) / (valid.std() + 1e-4)  # TRL: (r - mean) / (std + 1e-4) over the valid rows
    b = (0.0 - valid.mean()) / (valid.std() + 1e-4)
    assert out["advantages"].tolist() == pytest.approx([a, a, b, b, 0.0, a], abs=1e-5)
    trained = out["tool_mask"] * out["completion_mask"]  # TRL pads tool_mask with 1, completion_mask with 0
    assert trained.sum(dim=1).tolist() == [5, 5, 5, 5, 0, 5]  # each branch's 5 sampled tokens, C's pad none
    (report,) = source.reports
    assert dict(report.skipped) == {"fewer_trajectories": 1}
    assert report.extra_trajectories == 0 and report.rewards == [1.0, 0.0, 1.0]  # one reward per rollout


def test_trajectories_per_rollout_must_divide_the_group() -> None:
    with pytest.raises(UserError, match="divide group_size=3"):
        RolloutSource(memory_store(), {}, 3, lambda: CURRENT, trajectories_per_rollout=2)
    with pytest.raises(ConfigError, match="trajectories_per_rollout=2 must be >= 1 and divide"):
        tiny_train_config(Path("unused"), num_generations=2, trajectories_per_rollout=2)
