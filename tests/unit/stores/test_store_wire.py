"""The batch wire's patch acknowledgement (``stores/wire.py``): what a stored item comes back as."""

from __future__ import annotations

import math

from agentforge.stores.wire import (
    BatchItem,
    BatchRequest,
    BatchResults,
    batch_body,
    encode_item,
    json_bytes,
    parse,
    patch_of,
)
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


def test_items_encoded_one_by_one_parse_as_the_whole_request_would() -> None:
    exact = [-0.1 - 1e-17, 5e-324, -math.inf, math.nan, -0.30000000000000004]
    spans = [
        Span(rollout_id="ro-1", llm=LLMCall(prompt_token_ids=[0, 2**31 - 1, 151_000], logprobs=exact)),
        Span(rollout_id="ro-1", attributes={"lone": "\ud800 surrogate", "emoji": "✨"}),  # ASCII fallback
    ]
    reward = Reward(rollout_id="ro-1", value=math.nan)
    body = batch_body([encode_item(i) for i in [*spans, reward]])
    whole = BatchRequest(items=[BatchItem(span=spans[0]), BatchItem(span=spans[1]), BatchItem(reward=reward)])
    got, want = parse(BatchRequest, body), parse(BatchRequest, json_bytes(whole))
    assert got.ack == "patch" and want.ack == "full"
    assert got.items[0].span.llm.prompt_token_ids == [0, 2**31 - 1, 151_000]  # type: ignore[union-attr]
    got_lp = got.items[0].span.llm.logprobs  # type: ignore[union-attr]
    assert [math.isnan(a) or a == b for a, b in zip(got_lp, exact, strict=True)] == [True] * 5  # bit-exact
    assert got.items[1].span.attributes == spans[1].attributes  # type: ignore[union-attr]
    assert got.items[2].reward is not None and got.items[2].reward.valid is False
    assert [i.model_dump() for i in got.items][:2] == [i.model_dump() for i in want.items][:2]
