"""RolloutSource's rules for turning finished rollouts into TRL samples, on a real store (no model)."""

from __future__ import annotations

import math

from agentforge.testing import memory_store
from agentforge.trainers.rollouts import BatchReport, RolloutSource
from agentforge.types import AttemptState, LLMCall, Reward, RolloutState, Span, SpanKind, Task


def _finish(
    store,
    rollout,
    reward,
    *,
    completion=(5, 6),
    finish_reason="stop",
    version="policy@v1",
    ok=True,
    parts=None,
):
    claimed, attempt = store.claim_rollout("w")
    assert claimed.rollout_id == rollout.rollout_id
    call = LLMCall(
        prompt_token_ids=[1, 2],
        completion_token_ids=list(completion),
        logprobs=[-0.1] * len(completion),
        finish_reason=finish_reason,
        version=version,
    )
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


def test_dynamic_sampling_trains_the_groups_with_signal_and_reports_every_sampled_reward() -> None:
    """extra_tasks=2: 3 groups are sampled for 1 trained slot; the first group whose rewards differ is trained
    (TRL's own group, all 1.0, is left out), the same extra tasks are drawn again for the same step, and the
    batch reward is the mean over all 12 sampled rollouts."""
    import threading

    store = memory_store()
    tasks = {f"t{i}": Task(task_id=f"t{i}") for i in range(6)}
    source = RolloutSource(
        store, tasks, 4, lambda: "policy@v1", max_attempts=1, poll_s=0.01, extra_tasks=2, seed=7
    )
    extra = source.extra_prompts(["t0"] * 4)
    assert len(extra) == 8 and extra[:4] == [extra[0]] * 4 and "t0" not in extra
    assert source.extra_prompts(["t0"] * 4) == extra  # same seed and step → same draw (resume)
    rewards = {"t0": [1.0] * 4, extra[0]: [0.0, 1.0, 0.0, 0.0], extra[4]: [0.5, 0.0, 0.5, 0.5]}

    def finish_all() -> None:
        import time

        done, seen, deadline = 0, {t: 0 for t in rewards}, time.monotonic() + 30
        while done < 12 and time.monotonic() < deadline:
            claimed = store.claim_rollout("w")
            if claimed is None:
                continue
            rollout, attempt = claimed
            value = rewards[rollout.task.task_id][seen[rollout.task.task_id]]
            seen[rollout.task.task_id] += 1
            call = LLMCall(
                prompt_token_ids=[1, 2],
                completion_token_ids=[5, 6],
                logprobs=[-0.1, -0.1],
                finish_reason="stop",
                version="policy@v1",
            )
            store.add_span(
                Span(
                    rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, kind=SpanKind.llm, llm=call
                )
            )
            store.add_reward(Reward(rollout_id=rollout.rollout_id, value=value, final=True))
            store.finish_attempt(attempt.attempt_id, AttemptState.succeeded)
            done += 1

    worker = threading.Thread(target=finish_all)
    worker.start()
    out = source(["t0"] * 4)
    worker.join()
    assert sorted(out["reward"]) == [0.0, 0.0, 0.0, 1.0]  # the first group with signal
    report = source.reports[-1]
    assert report.rollouts == 12 and report.groups == 1 and report.dropped_groups == 2
    assert report.zero_variance_groups == 0 and len(report.rewards) == 12
    assert report.metrics()["batch/reward_mean"] == sum(sum(v) for v in rewards.values()) / 12
    assert report.metrics()["batch/dropped_groups"] == 2.0


def test_dynamic_sampling_falls_back_to_zero_variance_groups_when_too_few_have_signal() -> None:
    store = memory_store()
    source = _source(store)
    rollouts = source.enqueue(["t1"] * 4 + ["t2"] * 4)
    for r in rollouts:
        _finish(store, r, 1.0)
    report = _report(source)
    out = source.samples(source.wait(rollouts), report, trained=4)
    assert out["reward"] == [1.0] * 4 and report.dropped_groups == 1 and report.zero_variance_groups == 1
