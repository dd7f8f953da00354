"""The gateway's pooled upstream client on real sockets: connections are reused by plain and streamed calls,
and a stream the engine breaks off is reported to the client and recorded, never hangs."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import httpx

from agentforge.gateway.router import ModelRouter, Upstream
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


def _breaking_engine() -> tuple[socket.socket, threading.Thread]:
    """A raw HTTP server that starts a chunked SSE answer, sends one chunk and drops the connection."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            chunk = {
                "id": "x", "object": "chat.completion.chunk", "model": "base",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "par"}, "token_ids": [7]}],
            }  # fmt: skip
            event = f"data: {json.dumps(chunk)}\n\n".encode()
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            conn.sendall(head + f"{len(event):x}\r\n".encode() + event + b"\r\n")
            # no terminating chunk: the connection closes mid-body

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_a_stream_broken_by_the_engine_is_reported_and_recorded() -> None:
    server, thread = _breaking_engine()
    router = ModelRouter()
    router.register("policy@v1", Upstream(f"http://127.0.0.1:{server.getsockname()[1]}/v1", "base"))
    router.set_alias("policy", "policy@v1")
    store = memory_store()
    try:
        with serve_gateway(store, router) as gw:
            r = httpx.post(
                f"{gw.openai_base_url}/chat/completions", json={**CHAT, "stream": True}, timeout=30
            )
            thread.join(5)
    finally:
        server.close()
    assert r.status_code == 200
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "par"
    assert json.loads(events[-2])["error"]["code"] == "upstream_stream_error"
    (span,) = store.list_spans(orphans=True)
    assert span.status == "error" and "upstream stream broke" in (span.error or "")
    assert span.llm is not None and not span.llm.trainable and router.inflight("policy@v1") == 0
