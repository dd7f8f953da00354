"""The gateway's pooled upstream client on real sockets: connections are reused by plain and streamed calls,
and a stream the engine breaks off is reported to the client and recorded, never hangs."""

from __future__ import annotations

import json
from typing import Any

import httpx
from gateway_helpers import RawEngine, sse_chunk

from agentforge.gateway.server import AppServer, serve_gateway
from agentforge.testing import ScriptedTurn, ScriptedUpstream, memory_store

CHAT = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}


class _ClientPorts:
    """ASGI middleware recording the peer address of every HTTP request."""

    def __init__(self, app: Any) -> None:
        self.app, self.peers = app, set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.peers.add(tuple(scope["client"]))
        await self.app(scope, receive, send)


def test_plain_and_streamed_calls_reuse_upstream_connections() -> None:
    upstream = ScriptedUpstream([ScriptedTurn("pooled answer")], cycle=True)
    recorder = _ClientPorts(upstream.app)
    store = memory_store()
    with (
        AppServer(recorder) as engine,
        serve_gateway(store, upstream.router(base_url=f"{engine.url}/v1")) as gw,
    ):
        with httpx.Client(timeout=30) as client:
            for i in range(30):
                body = {**CHAT, "stream": i % 2 == 1}
                r = client.post(f"{gw.openai_base_url}/chat/completions", json=body)
                assert r.status_code == 200
                assert (
                    ("[DONE]" in r.text) if body["stream"] else r.json()["choices"][0]["message"]["content"]
                )
    assert upstream.served == 30
    assert len(store.list_spans(orphans=True)) == 30
    assert len(recorder.peers) <= 2, recorder.peers  # one keep-alive connection (two at most on a race)


def test_a_stream_broken_by_the_engine_is_reported_and_recorded() -> None:
    store = memory_store()
    chunk = sse_chunk({"role": "assistant", "content": "par"}, [7])
    with RawEngine([chunk]) as engine, serve_gateway(store, engine.router) as gw:  # drops mid-body
        r = httpx.post(f"{gw.openai_base_url}/chat/completions", json={**CHAT, "stream": True}, timeout=30)
    router = engine.router
    assert r.status_code == 200
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "par"
    assert json.loads(events[-2])["error"]["code"] == "upstream_stream_error"
    (span,) = store.list_spans(orphans=True)
    assert span.status == "error" and "upstream stream broke" in (span.error or "")
    assert span.llm is not None and not span.llm.trainable and router.inflight("policy@v1") == 0
