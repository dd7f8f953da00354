"""An idle keep-alive connection to the gateway outlives the clients' own idle expiry.

httpx (and so the OpenAI SDK) drops a pooled connection after 5 s idle; uvicorn's default closed it on the
server side after 5 s too, and a request sent on it at that moment failed with "Server disconnected without
sending a response" — a rollout lost to an ``openai.APIConnectionError`` (an agent runs with
``max_retries=0``). The servers now keep idle connections for :data:`~agentforge.config.HTTP_KEEP_ALIVE_S`.
"""

from __future__ import annotations

import json

import pytest
from gateway_helpers import CHAT, calls_idle_apart

from agentforge.config import HTTP_KEEP_ALIVE_S
from agentforge.gateway import GatewayServer
from agentforge.testing import ScriptedUpstream, memory_store
from agentforge.types import SpanKind

pytestmark = pytest.mark.slow

IDLE_S = 6.0  # past the 5 s idle expiry of httpx and of uvicorn's default keep-alive


def test_a_connection_idle_past_the_clients_expiry_still_carries_the_next_call() -> None:
    assert HTTP_KEEP_ALIVE_S > 15  # longer than httpx's (5 s) and aiohttp's (15 s) idle expiry
    store, upstream = memory_store(), ScriptedUpstream(["first", "second"])
    with upstream.serve() as engine, GatewayServer(store, upstream.router(base_url=f"{engine.url}/v1")) as gw:
        answers = calls_idle_apart(  # RemoteDisconnected when the server had closed it at 5 s
            gw.url,
            "POST",
            "/v1/chat/completions",
            IDLE_S,
            json.dumps(CHAT).encode(),
            {"content-type": "application/json"},
        )
    assert [status for status, _ in answers] == [200, 200]
    assert [json.loads(a)["choices"][0]["message"]["content"] for _, a in answers] == ["first", "second"]
    assert len(store.list_spans(kind=SpanKind.llm)) == 2
    store.close()
