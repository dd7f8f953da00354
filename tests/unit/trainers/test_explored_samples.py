"""Explored samples in offline GRPO (``StoredGroupSource(explored=True)``, ``TrainConfig.explored_samples``).

Guards against: a capture that explored its tool decision (first call at T = 2 with ``min_p``, greedy reply,
raw logprobs) being masked as unmatched when the run asks to train on it, or being trained when it does not.
"""

from __future__ import annotations

from pathlib import Path

from agentforge.stores.sql import SQLStore
from agentforge.trainers.replay.grpo import StoredGroupSource
from agentforge.trainers.replay.select import TraceFilter, select_traces
from agentforge.types import LLMCall, Reward, Rollout, RolloutState, Span, SpanKind, Task

PROMPT = [1, 2, 3]


def _explored_rollout(store: SQLStore, task: str, completion: list[int], reward: float) -> None:
    """One rollout: a hot, ``min_p`` first call and a greedy second call continuing it (raw logprobs)."""
    rollout = store.enqueue_rollout(Rollout(task=Task(task_id=task, input={})))
    store.update_rollout(rollout.rollout_id, state=RolloutState.running)
    calls = [
        ({"temperature": 2.0, "min_p": 0.2}, PROMPT, completion),
        ({"temperature": 0.0}, PROMPT + completion + [9], [7, 8]),
    ]
    for request, prompt, out in calls:
        call = LLMCall(
            version="policy@v1",
            request=request,
            prompt_token_ids=prompt,
            completion_token_ids=out,
            logprobs=[-0.5] * len(out),
            finish_reason="stop",
        )
        attributes = {"logprobs_mode": "raw_logprobs"}
        store.add_span(
            Span(kind=SpanKind.llm, rollout_id=rollout.rollout_id, llm=call, attributes=attributes)
        )
    store.add_reward(Reward(rollout_id=rollout.rollout_id, value=reward, final=True))
    store.update_rollout(rollout.rollout_id, state=RolloutState.succeeded)


def test_an_explored_capture_trains_only_when_asked(tmp_path: Path) -> None:
    with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as store:
        for completion, reward in (([4, 5], 1.0), ([4, 6], 0.0), ([5, 5], 0.5)):
            _explored_rollout(store, "task-a", completion, reward)
        records = select_traces(store, TraceFilter(require_reward=False)).records
        groups = {"task-a": records}
        for explored, kept in ((False, 0), (True, 3)):
            source = StoredGroupSource(groups, 3, explored=explored)
            out = source(["task-a"] * 3)
            report = source.reports[-1]
            assert report.skipped.get("unmatched_logprobs", 0) == 3 - kept
            assert out["reward"] == ([1.0, 0.0, 0.5] if explored else [None, None, None])
            if explored:  # one trajectory: both calls' sampled ids at mask 1, the joining id at mask 0
                assert out["completion_ids"][0] == [4, 5, 9, 7, 8]
                assert out["env_mask"][0] == [1, 1, 0, 1, 1]
