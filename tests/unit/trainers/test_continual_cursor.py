"""Issue 15, item 3 for continual mode: the cursor over rated conversations survives a kill -9.

A real SQLite store and runner threads (the re-runs' agent answers without an LLM: the cursor is under
test, not the samples). A first :class:`FeedbackSource` trains step 0 on two rated conversations, then forms
step 1's batch from the next two and "dies" before the step is trained; a second source with the same run
id (what a restart with the same ``output_dir`` builds) resumes at step 1.

Guards against: conversations marked used when their batch was formed and so lost by a crash before it was
trained (the resumed run waited for new ones: :class:`Stopped` here); the resumed step re-running the
openings as new rollouts instead of training the re-runs already formed; a conversation reserved or trained
by two steps; ``trained`` being recorded before the optimizer step.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from agentforge.runtime import Runner
from agentforge.runtime.tasks import enqueue_tasks
from agentforge.stores.sql import SQLStore
from agentforge.tracing import emit_reward
from agentforge.trainers.continual import APP_AGENT, REPLAY_AGENT
from agentforge.trainers.feedback import FeedbackSource, Stopped
from agentforge.trainers.rollouts import RolloutSource
from agentforge.types import LLMCall, Span, SpanKind

G = 2


def _rated_conversations(store: SQLStore, n: int) -> list[str]:
    """``n`` app conversations, each with one recorded opening call and a thumbs up."""
    ids = []
    for i, rollout in enumerate(enqueue_tasks(store, [{"i": i} for i in range(n)], agent=APP_AGENT)):
        request = {"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 4}
        call = LLMCall(model="policy", request=request, response_text=f"answer {i}")
        store.add_span(Span(rollout_id=rollout.rollout_id, kind=SpanKind.llm, llm=call))
        emit_reward(1.0, final=True, rollout_id=rollout.rollout_id, source="user_feedback", store=store)
        ids.append(rollout.rollout_id)
    return ids


def _source(store: SQLStore, run_id: str, stop: threading.Event) -> FeedbackSource:
    inner = RolloutSource(
        store, {}, G, lambda: "policy@v0", agent=REPLAY_AGENT, run_id=run_id, wait_timeout_s=60, poll_s=0.05
    )
    return FeedbackSource(store, inner, 2, stop, poll_s=0.05)


def test_a_batch_formed_before_a_kill_is_trained_after_the_restart(tmp_path: Path) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    runner = Runner(store, lambda task, ctx: 1.0, "http://127.0.0.1:9", workers=2, agent_name=REPLAY_AGENT)
    runner.start()
    try:
        conversations = _rated_conversations(store, 4)
        stop = threading.Event()
        first = _source(store, "run-1", stop)
        first.inner.step = 0
        first([])
        first.mark_trained(0)  # the optimizer step is done
        first.inner.step = 1
        first([])  # step 1's batch is formed ... and the process dies before training it (no mark_trained)
        formed = [r.rollout_id for r in store.list_rollouts(agent=REPLAY_AGENT) if r.metadata["step"] == 1]
        assert len(formed) == 2 * G
        early = [rid for rid in formed if "trained_step" in store.get_rollout(rid).metadata]
        assert not early, "a formed batch was marked trained before its optimizer step"
        marks = {rid: store.get_rollout(rid).metadata["continual"] for rid in conversations}
        assert [m.get("trained", False) for m in marks.values()] == [True, True, False, False]

        second = _source(store, "run-1", stop)  # the restart: same run id, resumed at step 1
        second.inner.step = 1
        timer = threading.Timer(10.0, stop.set)  # the old behaviour waits for new conversations forever
        timer.start()
        try:
            second([])
        except Stopped:
            raise AssertionError("the conversations reserved for step 1 before the kill were lost") from None
        finally:
            timer.cancel()
        second.mark_trained(1)
    finally:
        runner.stop()

    assert second.used == conversations[2:], "step 1 must train the conversations it had reserved"
    replays = store.list_rollouts(agent=REPLAY_AGENT)
    assert Counter(r.metadata["step"] for r in replays) == {0: 2 * G, 1: 2 * G}, (
        "step 1's re-runs were redone"
    )
    assert {r.rollout_id for r in replays if r.metadata["step"] == 1} == set(formed)
    assert all(r.metadata.get("trained_step") == r.metadata["step"] for r in replays)
    marks = {rid: store.get_rollout(rid).metadata["continual"] for rid in conversations}
    assert [(m["step"], m.get("trained")) for m in marks.values()] == [
        (0, True),
        (0, True),
        (1, True),
        (1, True),
    ]
    store.close()
