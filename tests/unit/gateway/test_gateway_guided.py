"""A guided call's span keeps the grammar-masked logprobs (agentforge.gateway.guided), against the scripted engine.

The gateway records the policy's recomputed logprobs in ``llm.logprobs`` and the engine's masked ones, zeros where
the grammar forced a token, in ``attributes["guided_logprobs"]``, for plain and streamed calls; the trainer's
samples mask exactly those tokens out of GRPO's loss. The same on vLLM: tests/integration/
test_forced_tool_schema_vllm.py.
"""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from gateway_helpers import parse_sse

from agentforge.gateway import guided
from agentforge.gateway.app import create_gateway
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.privacy import REDACTED_FLAG, PrivacyConfig, PrivacyMode
from agentforge.stores.sql import SQLStore
from agentforge.testing import ScriptedError, ScriptedToolCall, ScriptedTurn, ScriptedUpstream
from agentforge.trainers import samples
from agentforge.types import Rollout, Span

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
USER = [{"role": "user", "content": "Weather in Paris?"}]
FORCED = {"model": "policy", "messages": USER, "tools": TOOLS, "tool_choice": "required"}
PROMPT = [11, 12, 13, 14]
CALL_IDS = [901, 902, 903, 904, 905]
#: what the engine answered under the grammar: 902, 903 and 905 forced (probability 1), 901 and 904 chosen
MASKED = [-1.2, 0.0, -0.0, -0.3, 0.0]
#: the policy's own logprobs of the same tokens (the recomputation's prompt logprobs)
POLICY = [-2.5, -0.7, -0.2, -0.9, -0.05]
#: the span attribute the trainer reads (agentforge.trainers.samples.GUIDED_LOGPROBS_ATTRIBUTE)
ATTRIBUTE = "guided_logprobs"


def _guided_turns() -> list[ScriptedTurn]:
    """The forced tool call (masked logprobs), then the engine's answer to the recomputation."""
    call = ScriptedToolCall("get_weather", '{"city": "Paris"}', token_ids=CALL_IDS)
    answer = ScriptedTurn(tool_calls=[call], token_ids=[], logprobs=MASKED, prompt_token_ids=PROMPT)
    return [answer, ScriptedTurn("x", token_ids=[7], prompt_logprobs=POLICY)]


def _gateway(store: SQLStore, upstream: ScriptedUpstream, **kwargs: object) -> httpx.AsyncClient:
    """An in-process client of a gateway whose engine takes token-id prompts (the guided path's engines)."""
    router = ModelRouter()
    router.register("policy@v1", Upstream(base_url=upstream.base_url, model=upstream.model, token_in=True))
    router.set_alias("policy", "policy@v1")
    app: FastAPI = create_gateway(store, router, transport=upstream.transport(), **kwargs)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")


async def _call(client: httpx.AsyncClient, store: SQLStore, body: dict, stream: bool = False) -> Span:
    """Send ``body`` in a new rollout and return the call's stored span."""
    rid = store.enqueue_rollout(Rollout()).rollout_id
    response = await client.post(f"/rollouts/{rid}/v1/chat/completions", json={**body, "stream": stream})
    assert response.status_code == 200, response.text
    if stream:
        parse_sse(response.text)
    (span,) = store.list_spans(rollout_id=rid)
    return span


@pytest.mark.parametrize("stream", [False, True])
async def test_a_guided_span_keeps_the_masked_logprobs_and_an_unguided_one_has_none(
    gw_store: SQLStore, stream: bool
) -> None:
    upstream = ScriptedUpstream([*_guided_turns(), "It is sunny."])
    async with _gateway(gw_store, upstream) as client:
        span = await _call(client, gw_store, FORCED, stream)
        plain = await _call(client, gw_store, {"model": "policy", "messages": USER, "tools": TOOLS}, stream)
    llm = span.llm
    assert llm is not None and llm.stream is stream and llm.completion_token_ids == CALL_IDS
    assert guided.GUIDED_RECOMPUTED in llm.flags and llm.logprobs == POLICY
    assert span.attributes[ATTRIBUTE] == MASKED  # one per completion id, zeros where forced
    assert upstream.requests[1].body["prompt"] == PROMPT + CALL_IDS  # the recomputation's prompt
    assert plain.llm is not None and plain.llm.trainable and ATTRIBUTE not in plain.attributes
    assert guided.GUIDED_RECOMPUTED not in plain.llm.flags and upstream.served == 3  # no recomputation


async def test_a_failed_recomputation_keeps_the_masked_logprobs_in_the_call(gw_store: SQLStore) -> None:
    failed = ScriptedTurn(error=ScriptedError(500, "engine down"))
    upstream = ScriptedUpstream([*_guided_turns(), _guided_turns()[0], failed])
    async with _gateway(gw_store, upstream) as client:
        recomputed = await _call(client, gw_store, FORCED)
        kept = await _call(client, gw_store, FORCED)
    assert recomputed.attributes[ATTRIBUTE] == MASKED
    assert kept.llm is not None and kept.llm.logprobs == MASKED and kept.llm.trainable
    assert guided.GUIDED_NOT_RECOMPUTED in kept.llm.flags and ATTRIBUTE not in kept.attributes


async def test_the_trainer_masks_exactly_the_forced_tokens_of_a_stored_guided_call(
    gw_store: SQLStore,
) -> None:
    upstream = ScriptedUpstream(_guided_turns())
    async with _gateway(gw_store, upstream) as client:
        span = await _call(client, gw_store, FORCED, stream=True)
    (traj,) = samples.build_trajectories([span])
    assert traj.forced == [False, True, True, False, True] and traj.forced_tokens == 3
    sample = samples.grpo_sample(traj, 1.0, span.rollout_id)
    assert sample["completion_ids"] == CALL_IDS and sample["logprobs"] == POLICY
    assert sample["env_mask"] == [1, 0, 0, 1, 0]  # only the tokens the policy chose are trained
    assert samples.trajectory_sample(traj, 1.0, span.rollout_id)["env_mask"] == [1] * 5  # SFT/export: all
    assert samples.GUIDED_LOGPROBS_ATTRIBUTE == guided.GUIDED_LOGPROBS == ATTRIBUTE  # one name, both sides


async def test_redaction_withholds_the_masked_logprobs_with_the_ids(gw_store: SQLStore) -> None:
    secret = [{"role": "user", "content": "Weather where card 4111 1111 1111 1111 was used?"}]
    spans = {}
    for mode in (PrivacyMode.mask, PrivacyMode.redact):
        config = PrivacyConfig(mode=mode)
        async with _gateway(gw_store, ScriptedUpstream(_guided_turns()), privacy=config) as client:
            spans[mode] = await _call(client, gw_store, {**FORCED, "messages": secret})
    masked, redacted = spans[PrivacyMode.mask], spans[PrivacyMode.redact]
    assert masked.llm is not None and redacted.llm is not None
    assert guided.GUIDED_RECOMPUTED in masked.llm.flags and masked.attributes[ATTRIBUTE] == MASKED
    assert REDACTED_FLAG in redacted.llm.flags and redacted.llm.logprobs is None
    assert ATTRIBUTE not in redacted.attributes  # withheld with the ids and the policy's logprobs
