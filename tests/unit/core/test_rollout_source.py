"""RolloutSource's rules for turning finished rollouts into TRL samples, on a real store (no model)."""

from __future__ import annotations

import math

from agentforge.testing import memory_store
from agentforge.trainers.rollouts import BatchReport, RolloutSource
from agentforge.types import AttemptState, LLMCall, Reward, RolloutState, Span, SpanKind, Task


def _finish(store, rollout, reward, *, completion=(5, 6), finish_reason="stop", version="policy@v1", ok=True,
            parts=None):  # fmt: skip
    claimed, attempt = store.claim_rollout("w")
    assert claimed.rollout_id == rollout.rollout_id
    call = LLMCall(prompt_token_ids=[1, 2], completion_token_ids=list(completion),
                   logprobs=[-0.1] * len(completion), finish_reason=finish_reason, version=version)  # fmt: skip
    store.add_span(
        Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, kind=SpanKind.llm, llm=call)
    )
    if reward is not ...:
        meta = {"parts": parts} if parts is not None else {}
        store.add_reward(Reward(rollout_id=rollout.rollout_id, value=reward, final=True, metadata=meta))
    store.finish_attempt(attempt.attempt_id, AttemptState.succeeded if ok else AttemptState.failed)


def _source(store, current="policy@v1", staleness=1):
    tasks = {"t1": Task(task_id="t1"), "t2": Task(task_id="t2")}
    return RolloutSource(
        store, tasks, 4, lambda: current, max_staleness=staleness, max_attempts=1, poll_s=0.01
    )


def test_truncated_group_with_zero_reward_and_all_ones_group_report_zero_variance_without_nan() -> None:
    store = memory_store()
    source = _source(store)
    rollouts = source.enqueue(["t1"] * 4 + ["t2"] * 4)
    assert len({r.group_id for r in rollouts}) == 2 and all(
        r.resources == {"policy": "policy@v1"} for r in rollouts
    )
    for r in rollouts[:4]:
        _finish(store, r, 0.0, finish_reason="length")
    for r in rollouts[4:]:
        _finish(store, r, 1.0)
    report = _report(source)
    out = source.samples(source.wait(rollouts), report)
    assert out["reward"] == [0.0] * 4 + [1.0] * 4
    assert report.zero_variance_groups == 2 and report.truncated == 4
    metrics = report.metrics()
    assert metrics["batch/zero_variance_share"] == 1.0 and metrics["batch/truncated_share"] == 0.5
    assert not any(math.isnan(v) for v in metrics.values())


def test_failed_missing_invalid_and_stale_samples_are_masked_and_counted() -> None:
    store = memory_store()
    source = _source(store, current="policy@v5", staleness=1)
    rollouts = source.enqueue(["t1"] * 4)
    _finish(store, rollouts[0], 1.0, version="policy@v5")  # trained
    _finish(store, rollouts[1], None, version="policy@v5")  # None reward → masked, not 0
    _finish(store, rollouts[2], 1.0, version="policy@v2")  # 3 versions old → stale
    _finish(store, rollouts[3], 1.0, version="policy@v5", ok=False)  # failed → masked
    report = _report(source)
    out = source.samples(source.wait(rollouts), report)
    assert out["reward"] == [1.0, None, None, None]
    assert out["env_mask"][1:] == [[0], [0], [0]] and out["env_mask"][0] == [1, 1]
    assert report.skipped == {"missing_reward": 1, "stale": 1, "failed": 1}
    assert all(
        len(c) == len(lp) == len(m)
        for c, lp, m in zip(out["completion_ids"], out["logprobs"], out["env_mask"], strict=True)
    )
    assert store.get_rollout(rollouts[3].rollout_id).state == RolloutState.failed


def test_reward_parts_of_trained_samples_reach_the_batch_metrics_as_means() -> None:
    store = memory_store()
    source = _source(store)
    rollouts = source.enqueue(["t1"] * 4)
    parts = [{"tool": 1.0, "success": 1.0}, {"tool": 0.0, "success": 0.0}, {"tool": 1.0, "success": None}]
    for r, p in zip(rollouts, parts, strict=False):
        _finish(store, r, 0.5, parts=p)
    _finish(
        store, rollouts[3], 0.5, version="policy@v1", ok=False, parts={"tool": 0.0}
    )  # failed: not counted
    report = _report(source)
    source.samples(source.wait(rollouts), report)
    metrics = report.metrics()
    assert report.parts == {"tool": [1.0, 0.0, 1.0], "success": [1.0, 0.0]}  # a None part is left out
    assert metrics["batch/part/tool"] == 2 / 3 and metrics["batch/part/success"] == 0.5


def _report(source):
    return BatchReport(rollouts=8, groups=2)


def test_wait_withdraws_unstarted_rollouts_and_raises_when_none_finished() -> None:
    import pytest

    from agentforge.errors import RolloutTimeout

    store = memory_store()
    source = _source(store)
    source.wait_timeout_s = 0.2
    rollouts = source.enqueue(["t1"] * 4)
    _finish(store, rollouts[0], 1.0)
    latest = source.wait(rollouts)
    assert [r.state for r in latest] == [RolloutState.succeeded] + [RolloutState.cancelled] * 3
    with pytest.raises(RolloutTimeout, match="none of 4 rollouts finished"):
        source.wait(source.enqueue(["t2"] * 4))
