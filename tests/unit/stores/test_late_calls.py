"""Issue 16, medium 3: a late LLM call never rewrites a finished rollout's training data.

The reproduction: a rollout's call goes through the gateway, the rollout is scored and succeeds, then one
more call attributed to it arrives (an agent thread that outlived its attempt, a client retrying). The late
call is stored (visible, attributable, marked late) and the trainer's sample is still the first call with
its reward. The store rule itself is in the conformance suite (``test_late_spans_are_quarantined_...``).
"""

from __future__ import annotations

import logging

import pytest

from agentforge.testing import ScriptedTurn
from agentforge.trainers.rollouts import BatchReport, RolloutSource
from agentforge.types import AttemptState, Reward, SpanKind, Task


def _chat(content: str) -> dict[str, object]:
    return {"model": "policy", "messages": [{"role": "user", "content": content}], "max_tokens": 8}


async def test_a_late_call_is_stored_late_and_the_trainer_keeps_the_scored_trajectory(
    make_gateway, gw_client_for, gw_store, caplog: pytest.LogCaptureFixture
) -> None:
    turns = [ScriptedTurn(text="four", token_ids=[41, 42]), ScriptedTurn(text="five", token_ids=[51, 52, 53])]
    app, _ = make_gateway(turns)
    client = gw_client_for(app)
    source = RolloutSource(gw_store, {"t1": Task(task_id="t1")}, 1, lambda: "policy@v1", poll_s=0.01)
    (rollout,) = source.enqueue(["t1"])
    claimed = gw_store.claim_rollout("w-1")
    assert claimed is not None
    attempt_id = claimed[1].attempt_id
    prefix = f"/rollouts/{rollout.rollout_id}/v1/chat/completions"
    ok = await client.post(prefix, json=_chat("2+2?"), headers={"X-Attempt-Id": attempt_id})
    assert ok.status_code == 200
    gw_store.add_reward(Reward(rollout_id=rollout.rollout_id, value=1.0, final=True))
    gw_store.finish_attempt(attempt_id, AttemptState.succeeded)
    before = source.samples([gw_store.get_rollout(rollout.rollout_id)], BatchReport(rollouts=1, groups=1))

    with caplog.at_level(logging.WARNING, logger="agentforge.gateway"):
        late = await client.post(prefix, json=_chat("2+3?"), headers={"X-Attempt-Id": attempt_id})
    assert late.status_code == 200  # the caller still gets its answer; the store quarantines the record
    assert any("late" in r.getMessage() and rollout.rollout_id in r.getMessage() for r in caplog.records)

    spans = gw_store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm)
    assert [s.llm.completion_token_ids for s in spans if s.llm] == [[41, 42], [51, 52, 53]]
    assert "late" not in spans[0].attributes
    assert spans[1].attributes["late"] is True and "succeeded" in spans[1].attributes["late_reason"]
    assert spans[1].rollout_id == rollout.rollout_id and spans[1].attempt_id == attempt_id  # attributable
    after = source.samples([gw_store.get_rollout(rollout.rollout_id)], BatchReport(rollouts=1, groups=1))
    assert after == before
    assert after["completion_ids"] == [[41, 42]] and after["reward"] == [1.0]
