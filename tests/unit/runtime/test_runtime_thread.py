"""Thread-mode runner: concurrency, rewards from return values and scorers, failures, timeouts and retries,
the heartbeat watchdog, and a shutdown that leaves nothing running."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from runtime_agents import ask
from runtime_helpers import gateway_env

from agentforge.errors import ConfigError, RolloutTimeout, UserError
from agentforge.runtime import RolloutContext, Runner, enqueue_tasks, wait_for_rollouts
from agentforge.stores.sql import SQLStore
from agentforge.testing import memory_store
from agentforge.types import AttemptState, Rollout, RolloutState, Span, SpanKind, Task

FAST = {"heartbeat_s": 0.2, "heartbeat_timeout_s": 2.0, "poll_s": 0.02}
NO_GATEWAY = "http://127.0.0.1:9"  # agents below that never call the gateway


def _ids(rollouts: list[Rollout]) -> list[str]:
    return [r.rollout_id for r in rollouts]


def test_concurrent_workers_share_the_queue(tmp_path: Path) -> None:
    barrier = threading.Barrier(4, timeout=10)
    seen: list[tuple[str, str, str]] = []

    def agent(task: Task, ctx: RolloutContext) -> float:
        if task.input["i"] < 4:
            barrier.wait()  # only passes when 4 attempts run at once
        text = ask(ctx, [{"role": "user", "content": f"q{task.input['i']}"}])
        seen.append((ctx.rollout_id, ctx.worker_id, ctx.resources["policy"]))
        return 0.5 if text == "ok" else 0.0

    with gateway_env(tmp_path, ["ok"] * 12) as (store, gateway, upstream, _url):
        rollouts = enqueue_tasks(
            store, [{"i": i} for i in range(6)], group_size=2, resources={"policy": "policy@v1"}
        )
        with Runner(store, agent, gateway.url, workers=4, **FAST) as runner:
            done = runner.run_until_done(_ids(rollouts), timeout_s=30)
        assert [r.state for r in done] == [RolloutState.succeeded] * 12
        assert sorted(r for r, _, _ in seen) == sorted(_ids(rollouts))
        assert len({w for _, w, _ in seen}) == 4 and {p for _, _, p in seen} == {"policy@v1"}
        groups: dict[str | None, list[Rollout]] = {}
        for r in rollouts:
            groups.setdefault(r.group_id, []).append(r)
        assert len(groups) == 6 and all(len(g) == 2 and g[0].task == g[1].task for g in groups.values())
        for r in rollouts:
            reward = store.final_reward(r.rollout_id)
            assert reward is not None and (reward.value, reward.source, reward.final) == (0.5, "agent", True)
            (span,) = store.list_spans(rollout_id=r.rollout_id, valid_only=True)
            assert (
                span.kind is SpanKind.llm
                and span.attempt_id == store.list_attempts(r.rollout_id)[0].attempt_id
            )


def test_rewards_from_return_values_and_scorer() -> None:
    def agent(task: Task, ctx: RolloutContext) -> Any:
        kind = task.input["kind"]
        if kind == "emit":
            ctx.emit_reward(0.25, name="partial")
            from agentforge.tracing import emit_reward  # the plain function sees the runner's context

            emit_reward(0.75, final=True)
            return None
        return {"float": 2, "dict": {"reward": 0.5, "answer": "x"}, "none": None, "nan": float("nan")}[kind]

    store = memory_store()
    kinds = ["float", "dict", "none", "nan", "emit"]
    rollouts = enqueue_tasks(store, [{"kind": k} for k in kinds])
    with Runner(store, agent, NO_GATEWAY, **FAST) as runner:
        runner.run_until_done(_ids(rollouts), timeout_s=10)
    rewards = {r.task.input["kind"]: store.list_rewards(r.rollout_id) for r in rollouts}
    assert [(x.value, x.final, x.source) for x in rewards["float"]] == [(2.0, True, "agent")]
    assert [x.value for x in rewards["dict"]] == [0.5]
    assert rewards["none"] == []  # nothing returned, nothing emitted: no reward is invented
    assert [(x.value, x.valid) for x in rewards["nan"]] == [(None, False)]
    assert [(x.name, x.value, x.final) for x in rewards["emit"]] == [
        ("partial", 0.25, False),
        ("reward", 0.75, True),
    ]
    attempt_ids = {x.attempt_id for x in rewards["emit"]}
    assert attempt_ids == {store.list_attempts(rollouts[-1].rollout_id)[0].attempt_id}

    scored = enqueue_tasks(store, [{"kind": "float"}, {"kind": "none"}], agent="scored")
    scorer_calls: list[tuple[str, Any]] = []

    def scorer(task: Task, output: Any) -> float | None:
        scorer_calls.append((task.input["kind"], output))
        return None if output is None else 1.0

    with Runner(store, agent, NO_GATEWAY, scorer=scorer, agent_name="scored", **FAST) as runner:
        runner.run_until_done(_ids(scored), timeout_s=10)
    assert sorted(scorer_calls, key=str) == [("float", 2), ("none", None)]
    assert [(x.value, x.source, x.final) for x in store.list_rewards(scored[0].rollout_id)] == [
        (1.0, "scorer", True)
    ]
    assert [(x.value, x.valid) for x in store.list_rewards(scored[1].rollout_id)] == [(None, False)]


def test_reward_extras_are_kept_as_named_parts(caplog: pytest.LogCaptureFixture) -> None:
    def agent(task: Task, ctx: RolloutContext) -> Any:
        return {"reward": 1.0, "db_match": True, "outputs": 0.5, "nan": float("nan"), "transcript": ["hi"]}

    def scorer(task: Task, output: Any) -> Any:
        return {"reward": output["outputs"], "judge": 0.25}

    store = memory_store()
    (plain,) = enqueue_tasks(store, [{}])
    with Runner(store, agent, NO_GATEWAY, **FAST) as runner:
        runner.run_until_done([plain.rollout_id], timeout_s=10)
    (reward,) = store.list_rewards(plain.rollout_id)
    assert reward.value == 1.0 and reward.source == "agent"
    assert reward.metadata == {
        "parts": {"db_match": 1.0, "outputs": 0.5, "nan": None},
        "unscored_keys": ["transcript"],
    }
    assert "transcript" in caplog.text  # the non-number key is named, not dropped without a word

    (scored,) = enqueue_tasks(store, [{}], agent="scored")
    with Runner(store, agent, NO_GATEWAY, scorer=scorer, agent_name="scored", **FAST) as runner:
        runner.run_until_done([scored.rollout_id], timeout_s=10)
    (reward,) = store.list_rewards(scored.rollout_id)
    assert (reward.value, reward.source, reward.metadata) == (0.5, "scorer", {"parts": {"judge": 0.25}})


def test_agent_and_scorer_errors_fail_the_attempt_without_a_reward() -> None:
    def agent(task: Task, ctx: RolloutContext) -> float:
        if task.input.get("boom"):
            raise ValueError("tool exploded: ünïcode ✓")
        return 1.0

    def scorer(task: Task, output: Any) -> float:
        if task.input.get("bad_score"):
            raise KeyError("gold")
        return output

    store = memory_store()
    rollouts = enqueue_tasks(store, [{"boom": True}, {"bad_score": True}, {}], max_attempts=2)
    with Runner(store, agent, NO_GATEWAY, scorer=scorer, **FAST) as runner:
        done = runner.run_until_done(_ids(rollouts), timeout_s=10)
    assert [r.state for r in done] == [RolloutState.failed, RolloutState.failed, RolloutState.succeeded]
    assert done[0].error == "ValueError: tool exploded: ünïcode ✓" and done[0].attempts == 2
    assert done[1].error == "KeyError: 'gold'"
    for r in done[:2]:
        assert store.list_rewards(r.rollout_id) == []  # failed, not scored 0
        assert [a.state for a in store.list_attempts(r.rollout_id)] == [AttemptState.failed] * 2
    assert len(store.list_rollouts(state=RolloutState.succeeded)) + len(
        store.list_rollouts(state=RolloutState.failed)
    ) == len(rollouts)


def test_timeout_marks_timed_out_then_retries_and_refuses_late_writes() -> None:
    late: dict[str, BaseException | None] = {}
    woke = threading.Event()
    cancelled = threading.Event()

    def sync_agent(task: Task, ctx: RolloutContext) -> float:
        if ctx.attempt_number == 1:
            time.sleep(1.0)  # outlives its 0.3 s limit: the runner abandons this thread
            try:
                ctx.emit_reward(999.0, final=True)
                late["err"] = None
            except RolloutTimeout as exc:
                late["err"] = exc
            woke.set()
        return 1.0

    async def async_agent(task: Task, ctx: RolloutContext) -> float:
        if task.input.get("hang") and (ctx.attempt_number == 1 or task.input.get("always")):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return 1.0

    store = memory_store()
    (sync_ro,) = enqueue_tasks(store, [{}], timeout_s=0.3)
    with Runner(store, sync_agent, NO_GATEWAY, **FAST) as runner:
        (done,) = runner.run_until_done([sync_ro.rollout_id], timeout_s=10)
        assert woke.wait(5)
    assert done.state is RolloutState.succeeded and done.attempts == 2
    first, second = store.list_attempts(sync_ro.rollout_id)
    assert first.state is AttemptState.timed_out and "timeout_s=0.3" in (first.error or "")
    assert second.state is AttemptState.succeeded
    assert isinstance(late["err"], RolloutTimeout)
    assert [r.value for r in store.list_rewards(sync_ro.rollout_id)] == [1.0]

    retried, hopeless = enqueue_tasks(
        store, [{"hang": True}, {"hang": True, "always": True}], timeout_s=0.3, max_attempts=2, agent="async"
    )
    with Runner(store, async_agent, NO_GATEWAY, workers=2, agent_name="async", **FAST) as runner:
        done_retried, done_hopeless = runner.run_until_done([retried.rollout_id, hopeless.rollout_id], 10)
    assert cancelled.is_set()  # the coroutine was cancelled, not abandoned
    assert done_retried.state is RolloutState.succeeded
    assert done_hopeless.state is RolloutState.timed_out and done_hopeless.attempts == 2
    assert store.final_reward(hopeless.rollout_id) is None


def test_stop_gives_back_running_rollouts_and_nothing_stays_running() -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    def agent(task: Task, ctx: RolloutContext) -> float:
        started.release()
        release.wait(30)
        return 1.0

    store = memory_store()
    rollouts = enqueue_tasks(store, [{"i": i} for i in range(3)], max_attempts=1)
    runner = Runner(store, agent, NO_GATEWAY, workers=2, shutdown_grace_s=0.2, **FAST).start()
    assert started.acquire(timeout=5) and started.acquire(timeout=5)
    runner.stop()
    release.set()
    assert not runner.running
    assert store.list_rollouts(state=RolloutState.running) == []
    states = sorted(r.state.value for r in store.list_rollouts())
    assert states == ["queued"] * 3  # given back even though each had used its only attempt
    given_back = [a for r in rollouts for a in store.list_attempts(r.rollout_id)]
    assert len(given_back) == 2
    assert all(a.state is AttemptState.abandoned and a.error.startswith("shutdown") for a in given_back)

    with Runner(store, lambda task, ctx: 1.0, NO_GATEWAY, workers=2, **FAST) as runner:
        done = runner.run_until_done(_ids(rollouts), timeout_s=10)
    assert [r.state for r in done] == [RolloutState.succeeded] * 3


def test_watchdog_requeues_a_dead_workers_rollout(tmp_path: Path) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    (rollout,) = enqueue_tasks(store, [{}])
    claimed = store.claim_rollout("dead-host:1:w0")  # a worker that then died: it never heartbeats
    assert claimed is not None
    dead = claimed[1]
    store.add_span(
        Span(rollout_id=rollout.rollout_id, attempt_id=dead.attempt_id, kind=SpanKind.llm, name="x")
    )

    def agent(task: Task, ctx: RolloutContext) -> float:
        ctx.emit_span("step", {"n": 1})
        return 1.0

    with Runner(store, agent, NO_GATEWAY, **FAST) as runner:
        (done,) = runner.run_until_done([rollout.rollout_id], timeout_s=10)
    assert done.state is RolloutState.succeeded
    first, second = store.list_attempts(rollout.rollout_id)
    assert first.state is AttemptState.abandoned and second.state is AttemptState.succeeded
    assert [s.name for s in store.list_spans(rollout_id=rollout.rollout_id, valid_only=True)] == ["step"]
    store.close()


def test_wait_for_rollouts_times_out_with_counts() -> None:
    store = memory_store()
    rollouts = enqueue_tasks(store, [{}, {}])
    with pytest.raises(RolloutTimeout, match=r"2 of 2 rollouts unfinished after 0.1 s: \{'queued': 2\}"):
        wait_for_rollouts(store, _ids(rollouts), timeout_s=0.1, poll_s=0.02)


def test_config_is_validated() -> None:
    store = memory_store()
    with pytest.raises(ConfigError, match=r"heartbeat_timeout_s=1.0\) must exceed 2 \* heartbeat_s = 2.0"):
        Runner(store, lambda t, c: 1.0, NO_GATEWAY, heartbeat_s=1.0, heartbeat_timeout_s=1.0)
    with pytest.raises(ConfigError, match="in-memory SQLite"):
        Runner(store, "runtime_agents:one_call_agent_factory", NO_GATEWAY, mode="process")
    with pytest.raises(ConfigError, match="workers=0"):
        Runner(store, lambda t, c: 1.0, NO_GATEWAY, workers=0)
    with pytest.raises(UserError, match="mode='fork'"):
        Runner(store, lambda t, c: 1.0, NO_GATEWAY, mode="fork")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="no attribute 'nope'"):
        Runner(store, "runtime_agents:nope", NO_GATEWAY)
    with pytest.raises(ConfigError, match="group_size=0"):
        enqueue_tasks(store, [{}], group_size=0)
