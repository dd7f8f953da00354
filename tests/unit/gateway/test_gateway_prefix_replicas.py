"""A conversation served by several gateway replicas (issue 39): each replica keeps the token-in continuation of
the rollouts it served in memory, and rebuilds what it lacks — a rollout another replica served, or one it
served before it restarted, or calls of it another replica answered since — from the spans in the shared
store. A 4-turn tool conversation whose calls alternate between two replicas and a freshly started third is
one trajectory, every follow-up continued token-in (the scripted engine's fake chat template, over HTTP), with
the user's address masked alike by every replica (privacy is on: a new replica numbers the placeholders of the
history as the first one did, so the masked history still matches the stored calls)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from agentforge.gateway.prefix import BREAK_PREFIX, CONTINUED
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.gateway.server import GatewayServer
from agentforge.stores.sql import SQLStore
from agentforge.testing import ScriptedToolCall, ScriptedTurn, ScriptedUpstream
from agentforge.trainers.samples import build_trajectories
from agentforge.types import Rollout, SpanKind

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def _hermes(city: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'get_weather', 'arguments': {'city': city}})}\n</tool_call>"


def _router(engine_url: str) -> ModelRouter:
    router = ModelRouter()
    router.register("policy@v1", Upstream(f"{engine_url}/v1", "base", token_in=True))
    router.set_alias("policy", "policy@v1")
    return router


def test_a_tool_conversation_is_one_trajectory_whichever_replica_serves_each_call(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    engine = ScriptedUpstream(
        [
            ScriptedTurn(tool_calls=[ScriptedToolCall("get_weather", '{"city": "Paris"}')]),  # chat route
            _hermes("Rome"),  # the follow-ups reach the engine as token ids (/v1/completions)
            _hermes("Oslo"),
            "Paris 18 C, Rome 24 C, Oslo 9 C.",
        ]
    )
    stores = [SQLStore(url) for _ in range(3)]
    with engine.serve() as served:
        a, b = (GatewayServer(s, _router(served.url)).start() for s in stores[:2])
        try:
            rollout_id = stores[0].enqueue_rollout(Rollout()).rollout_id
            messages: list[dict] = [
                {
                    "role": "user",
                    "content": "Weather in Paris, Rome and Oslo? Mail me at jane.doe@example.com.",
                }
            ]

            def turn(gateway: GatewayServer) -> dict:
                body = {"model": "policy", "messages": messages, "tools": TOOLS}
                answer = httpx.post(
                    f"{gateway.rollout_base_url(rollout_id)}/chat/completions", json=body, timeout=30
                )
                assert answer.status_code == 200, answer.text
                message = answer.json()["choices"][0]["message"]
                messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
                for call in message.get("tool_calls") or []:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "sunny"})
                return message

            turn(a)  # turn 1 on replica a
            turn(b)  # turn 2 on b, which never saw the rollout
            turn(a)  # turn 3 on a, which remembers only turn 1
            b.stop()  # a replica restarted: turn 4 on a new process
            b = GatewayServer(stores[2], _router(served.url)).start()
            final = turn(b)
        finally:
            a.stop()
            b.stop()
    spans = stores[0].list_spans(rollout_id=rollout_id, kind=SpanKind.llm)
    for store in stores:
        store.close()
    assert final["content"] == "Paris 18 C, Rome 24 C, Oslo 9 C." and len(spans) == 4
    assert [r.path for r in engine.requests] == ["/v1/chat/completions"] + ["/v1/completions"] * 3
    flags = [s.llm.flags for s in spans if s.llm is not None]
    assert all(CONTINUED in f for f in flags[1:]), flags
    assert not [f for fs in flags for f in fs if f.startswith(BREAK_PREFIX)], flags
    assert "jane.doe@example.com" not in "".join(s.model_dump_json() for s in spans)
    (trajectory,) = build_trajectories(spans)  # one conversation, one trajectory
    assert sum(trajectory.env_mask) == sum(len(s.llm.completion_token_ids or []) for s in spans if s.llm)
