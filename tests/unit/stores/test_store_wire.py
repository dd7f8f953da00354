"""The batch wire's patch acknowledgement (``stores/wire.py``): what a stored item comes back as."""

from __future__ import annotations

import math

from agentforge.stores.wire import BatchItem, BatchRequest, BatchResults, json_bytes, parse, patch_of
from agentforge.types import LLMCall, Reward, Span


def test_a_fresh_span_comes_back_as_the_fields_the_store_set() -> None:
    sent = Span(rollout_id="ro-1", llm=LLMCall(prompt_token_ids=[1, 2], logprobs=[-math.inf]))
    stored = sent.model_copy(update={"sequence": 7, "attempt_id": "at-1"})
    assert patch_of(sent, stored) == {"sequence": 7, "attempt_id": "at-1"}
    assert sent.model_copy(update=patch_of(sent, stored)) == stored
    quarantined = stored.model_copy(update={"attributes": {"late": True, "late_reason": "finished"}})
    assert patch_of(sent, quarantined)["attributes"] == {"late": True, "late_reason": "finished"}


def test_an_item_stored_earlier_with_other_content_is_not_a_patch() -> None:
    sent = Span(span_id="sp-1", rollout_id="ro-1", name="changed")
    existing = Span(span_id="sp-1", rollout_id="ro-1", name="first", sequence=3, started_at=sent.started_at)
    assert patch_of(sent, existing) is None
    assert patch_of(Reward(rollout_id="ro-1", value=1.0), sent) is None  # another kind entirely


def test_nan_values_do_not_count_as_changes_and_the_request_defaults_to_full() -> None:
    sent = Span(rollout_id="ro-1", ended_at=math.nan)
    stored = sent.model_copy(update={"sequence": 2, "ended_at": math.nan})  # another NaN object
    assert patch_of(sent, stored) == {"sequence": 2}
    sent = Reward(reward_id="rw-1", rollout_id="ro-1", value=math.nan)  # a missing reward: None, not valid
    request = parse(BatchRequest, json_bytes(BatchRequest(items=[BatchItem(reward=sent)])))
    assert request.ack == "full"
    results = parse(BatchResults, b'{"results": [{"patch": {"sequence": 2}}]}')
    assert results.results[0].patch == {"sequence": 2} and results.results[0].reward is None
