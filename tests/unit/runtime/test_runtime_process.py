"""Process-mode runner: spawned workers on a SQLite file, a real gateway on a port, a scripted upstream.

* 4 workers run 100 rollouts: each stored once, succeeded, with exactly one valid LLM span and its reward.
* ``kill -9`` of the worker running a marked rollout: the heartbeat watchdog re-queues it, another
  worker finishes it, and only the successful attempt's spans count (``valid_only``).
* SIGTERM to a worker gives its rollout back; ``Runner.stop`` leaves nothing ``running``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from runtime_agents import one_call_agent, stuck_sync_agent
from runtime_helpers import gateway_env

from agentforge.errors import RunError
from agentforge.runtime import Runner, enqueue_tasks
from agentforge.stores.base import TraceStore
from agentforge.types import Attempt, AttemptState, RolloutState, SpanKind, Task

pytestmark = pytest.mark.slow

FAST = {"heartbeat_s": 0.2, "heartbeat_timeout_s": 2.0, "poll_s": 0.05}
# For the tests where no worker dies: a worker starved of CPU for over 2 s on a loaded CI machine was declared
# dead, its rollout re-queued and failed (the scripted upstream had no answer left for a second attempt).
STEADY = {**FAST, "heartbeat_timeout_s": 30.0}


def _wait_running(store: TraceStore, rollout_id: str, timeout_s: float = 30.0) -> Attempt:
    """The rollout's running attempt, once it has recorded its LLM span."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = [a for a in store.list_attempts(rollout_id) if a.state is AttemptState.running]
        if running and store.list_spans(attempt_id=running[0].attempt_id, kind=SpanKind.llm):
            return running[0]
        time.sleep(0.05)
    raise AssertionError(f"rollout {rollout_id} never got a running attempt with an LLM span")


def _pid(attempt: Attempt) -> int:
    return int(attempt.worker_id.split(":")[1])


def test_four_processes_run_100_rollouts(tmp_path: Path) -> None:
    with gateway_env(tmp_path, ["ok"] * 100) as (store, gateway, upstream, url):
        rollouts = enqueue_tasks(store, [Task(input={"q": f"question {i}"}) for i in range(100)])
        with Runner(
            url, "runtime_agents:one_call_agent_factory", gateway.url, workers=4, mode="process", **STEADY
        ) as runner:
            done = runner.run_until_done([r.rollout_id for r in rollouts], timeout_s=60)
            assert len(runner.worker_pids()) == 4
        assert [r.state for r in done] == [RolloutState.succeeded] * 100
        assert len(store.list_rollouts()) == 100
        llm = store.list_spans(kind=SpanKind.llm, valid_only=True)
        assert sorted(s.rollout_id for s in llm) == sorted(r.rollout_id for r in rollouts)
        assert all(s.status == "ok" and s.attempt_id for s in llm)
        workers = set()
        for r in done:
            (attempt,) = store.list_attempts(r.rollout_id)
            workers.add(attempt.worker_id)
            reward = store.final_reward(r.rollout_id)
            assert reward is not None and reward.value == 1.0 and reward.attempt_id == attempt.attempt_id
        assert len(workers) >= 2, workers  # the work was shared
        assert upstream.remaining == 0


def test_process_workers_on_the_http_store(tmp_path: Path) -> None:
    """Workers that reach the store only over HTTP (the gateway also serves the store API)."""
    with gateway_env(tmp_path, ["ok"] * 10) as (store, gateway, upstream, _url):
        with Runner(gateway.url, one_call_agent, gateway.url, workers=2, mode="process", **STEADY) as runner:
            assert type(runner.store).__name__ == "HTTPStore"
            rollouts = enqueue_tasks(runner.store, [Task(input={"q": f"q{i}"}) for i in range(10)])
            done = runner.run_until_done([r.rollout_id for r in rollouts], timeout_s=30)
        assert [r.state for r in done] == [RolloutState.succeeded] * 10
        assert len(store.list_spans(kind=SpanKind.llm, valid_only=True)) == 10
        assert all(store.final_reward(r.rollout_id).value == 1.0 for r in rollouts)  # type: ignore[union-attr]


def test_workers_that_cannot_start_fail_the_wait_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agentforge.runtime.runner._MAX_QUICK_EXITS", 2)
    with gateway_env(tmp_path, []) as (store, gateway, upstream, url):
        (rollout,) = enqueue_tasks(store, [Task()])
        with Runner(
            url, "runtime_agents:broken_agent_factory", gateway.url, mode="process", **FAST
        ) as runner:
            with pytest.raises(RunError, match="keep exiting right after they start"):
                runner.run_until_done([rollout.rollout_id], timeout_s=60)
            assert runner.respawned == 1
        assert store.get_rollout(rollout.rollout_id).state is RolloutState.queued


def test_stuck_sync_agent_times_out_and_its_process_is_recycled(tmp_path: Path) -> None:
    with gateway_env(tmp_path, []) as (store, gateway, upstream, url):
        (rollout,) = enqueue_tasks(store, [Task()], timeout_s=1.0)
        with Runner(url, stuck_sync_agent, gateway.url, mode="process", **FAST) as runner:
            (first_pid,) = runner.worker_pids()
            (done,) = runner.run_until_done([rollout.rollout_id], timeout_s=30)
            assert done.state is RolloutState.succeeded
            first, second = store.list_attempts(rollout.rollout_id)
            assert first.state is AttemptState.timed_out and "timeout_s=1" in (first.error or "")
            assert _pid(first) == first_pid and _pid(second) != first_pid  # the stuck process was replaced
            assert runner.respawned == 1 and first_pid not in runner.worker_pids()


def test_kill_9_worker_is_requeued_and_not_double_counted(tmp_path: Path) -> None:
    with gateway_env(tmp_path, ["ok"] * 10) as (store, gateway, upstream, url):
        marked = enqueue_tasks(store, [Task(input={"q": "marked", "hang": 120})])[0]
        others = enqueue_tasks(store, [Task(input={"q": f"q{i}"}) for i in range(4)])
        with Runner(url, one_call_agent, gateway.url, workers=3, mode="process", **FAST) as runner:
            dead = _wait_running(store, marked.rollout_id)
            assert _pid(dead) in runner.worker_pids()
            os.kill(_pid(dead), signal.SIGKILL)
            done = runner.run_until_done([marked.rollout_id] + [r.rollout_id for r in others], timeout_s=30)
            deadline = time.monotonic() + 5
            while runner.respawned < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert runner.respawned >= 1
        assert [r.state for r in done] == [RolloutState.succeeded] * 5
        first, second = store.list_attempts(marked.rollout_id)
        assert first.attempt_id == dead.attempt_id and first.state is AttemptState.abandoned
        assert "heartbeat" in (first.error or "")
        assert second.state is AttemptState.succeeded and second.worker_id != first.worker_id
        all_spans = store.list_spans(rollout_id=marked.rollout_id, kind=SpanKind.llm)
        valid = store.list_spans(rollout_id=marked.rollout_id, kind=SpanKind.llm, valid_only=True)
        assert {s.attempt_id for s in all_spans} == {first.attempt_id, second.attempt_id}
        assert [s.span_id for s in valid] == [
            s.span_id for s in store.list_spans(attempt_id=second.attempt_id, kind=SpanKind.llm)
        ]
        assert len(valid) == 1
        rewards = store.list_rewards(marked.rollout_id)
        assert [(r.value, r.attempt_id) for r in rewards] == [(1.0, second.attempt_id)]


def test_sigterm_gives_back_and_stop_leaves_nothing_running(tmp_path: Path) -> None:
    with gateway_env(tmp_path, ["ok"] * 10) as (store, gateway, upstream, url):
        runner = Runner(
            url, one_call_agent, gateway.url, workers=2, mode="process", shutdown_grace_s=0.3, **FAST
        ).start()
        try:
            first = enqueue_tasks(store, [Task(input={"q": "term", "hang": 120})])[0]
            att = _wait_running(store, first.rollout_id)
            os.kill(_pid(att), signal.SIGTERM)  # graceful: the worker gives the rollout back
            (done,) = runner.run_until_done([first.rollout_id], timeout_s=30)
            assert done.state is RolloutState.succeeded
            given_back, finished = store.list_attempts(first.rollout_id)
            assert given_back.state is AttemptState.abandoned and (given_back.error or "").startswith(
                "shutdown"
            )
            assert finished.state is AttemptState.succeeded

            stuck = enqueue_tasks(
                store, [Task(input={"q": "stop", "hang": 120, "always": True})], max_attempts=1
            )[0]
            _wait_running(store, stuck.rollout_id)
        finally:
            t0 = time.monotonic()
            runner.stop()
        assert time.monotonic() - t0 < 10
        assert store.list_rollouts(state=RolloutState.running) == []
        after = store.get_rollout(stuck.rollout_id)
        assert after.state is RolloutState.queued  # its only attempt was given back, not failed
        (attempt,) = store.list_attempts(stuck.rollout_id)
        assert attempt.state is AttemptState.abandoned and (attempt.error or "").startswith("shutdown")
