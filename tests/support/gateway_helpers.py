"""Helpers shared by the gateway tests (not fixtures)."""

from __future__ import annotations

import contextlib
import faulthandler
import http.client
import json
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx

CHAT = {"model": "policy", "messages": [{"role": "user", "content": "What time is it?"}]}


def calls_idle_apart(
    url: str,
    method: str,
    path: str,
    idle_s: float,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> list[tuple[int, bytes]]:
    """Send the same request twice on one HTTP/1.1 keep-alive connection to ``url``, ``idle_s`` seconds apart.

    Returns:
        ``(status, body)`` of each answer.

    Raises:
        http.client.RemoteDisconnected: the server closed the idle connection before the second call.
        AssertionError: an answer did not keep the connection alive, or the second call used another one.
    """
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    answers, sockets = [], []
    try:
        for pause in (0.0, idle_s):
            time.sleep(pause)
            conn.request(method, path, body, headers or {})
            sockets.append(conn.sock)
            response = conn.getresponse()
            answers.append((response.status, response.read()))
            assert not response.will_close, response.getheaders()
    finally:
        conn.close()
    assert sockets[0] is sockets[1]  # the second call travelled on the first one's connection
    return answers


def give_up_after(read_s: float) -> httpx.Timeout:
    """A client that gives up on the *answer* after ``read_s`` seconds but waits up to 60 s to connect and send.

    Tests that make a client leave mid-call must fail only on the read: a busy CI host may take longer than the read
    budget just to accept 60 connections (a bare ``timeout=0.5`` then raises ``ConnectTimeout`` instead)."""
    return httpx.Timeout(60.0, read=read_s)


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Decode a complete SSE body, asserting it is well formed and ends with ``data: [DONE]``."""
    assert text.endswith("\n\n"), text[-200:]
    events = text[:-2].split("\n\n")
    assert events[-1] == "data: [DONE]", events[-1]
    out = []
    for event in events[:-1]:
        assert event.startswith("data: ") and "\n" not in event, event[:200]
        out.append(json.loads(event[len("data: ") :]))
    return out


def streamed_arguments(chunks: list[dict[str, Any]]) -> dict[int, str]:
    """Accumulate tool-call arguments the way an OpenAI client does."""
    args: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                args[call["index"]] = args.get(call["index"], "") + (call.get("function") or {}).get(
                    "arguments", ""
                )
    return args


class RawEngine:
    """A one-request HTTP engine on a raw socket: it starts a chunked SSE answer holding ``events`` (``data``
    payloads; dicts are JSON-encoded) in one chunk and never sends the terminating chunk. It then drops the
    connection at once, or holds it open until :meth:`close` when ``hold`` is true.

    Attributes:
        router: a router whose alias ``policy`` → ``policy@v1`` is served by this engine.
    """

    def __init__(self, events: list[Any], hold: bool = False) -> None:
        import socket
        import threading

        from agentforge.gateway.router import ModelRouter, Upstream

        self._server, self._released = socket.socket(), threading.Event()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen()
        self._events, self._hold = events, hold
        self.router = ModelRouter()
        self.router.register(
            "policy@v1", Upstream(f"http://127.0.0.1:{self._server.getsockname()[1]}/v1", "base")
        )
        self.router.set_alias("policy", "policy@v1")
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._server.accept()
        with conn:
            conn.recv(65536)
            body = "".join(
                f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in self._events
            ).encode()
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            conn.sendall(head + f"{len(body):x}\r\n".encode() + body + b"\r\n")
            if self._hold:
                self._released.wait(30)

    def close(self) -> None:
        """Release a held connection and stop listening."""
        self._released.set()
        self._thread.join(5)
        self._server.close()

    def __enter__(self) -> RawEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sse_chunk(
    delta: dict[str, Any], token_ids: list[int], finish_reason: str | None = None
) -> dict[str, Any]:
    """A vLLM-shaped streamed chat chunk for :class:`RawEngine`."""
    choice = {"index": 0, "delta": delta, "token_ids": token_ids, "finish_reason": finish_reason}
    return {"id": "x", "object": "chat.completion.chunk", "model": "base", "choices": [choice]}


@contextlib.contextmanager
def stacks_on_timeout() -> Iterator[None]:
    """On an ``httpx.TimeoutException`` inside the block, print every thread's stack to stderr (pytest shows it
    with the failure), so a request that hangs on a busy CI host says what the server's threads were doing."""
    try:
        yield
    except httpx.TimeoutException:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        raise


class ByHostTransport(httpx.AsyncBaseTransport):
    """Routes each engine request to the scripted engine named by its URL's host (``http://acme/v1`` → the
    engine under ``"acme"``): one gateway, one scripted engine per tenant adapter."""

    def __init__(self, engines: dict[str, Any]) -> None:
        self.transports = {host: engine.transport() for host, engine in engines.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.transports[request.url.host].handle_async_request(request)


def tenant_router(engines: dict[str, Any]) -> Any:
    """A ``ModelRouter`` whose shared ``policy`` is ``engines["shared"]``'s ``policy@v1`` and whose tenants
    ``acme`` and ``bolt`` each have a live version of their own lineage (``policy@acme/v1``) on their
    engine."""
    from agentforge.gateway.router import ModelRouter

    router = ModelRouter()
    router.register("policy@v1", engines["shared"].upstream("http://shared/v1"))
    router.set_alias("policy", "policy@v1")
    for tenant in ("acme", "bolt"):
        router.register(f"policy@{tenant}/v1", engines[tenant].upstream(f"http://{tenant}/v1"))
        router.set_alias(f"policy@{tenant}", f"policy@{tenant}/v1")
    return router
