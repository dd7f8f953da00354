"""The served apps' transport proxy (HeadWithBody): a response head leaves with the first body bytes in one
write, alone at the next loop turn when no body follows, before a close; other writes pass straight through;
and a real server's answers (plain, streamed, head-only, a closed connection) arrive whole and in order."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from agentforge.gateway.server import AppServer, HeadWithBody

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


async def test_a_head_is_sent_with_the_next_write_in_one_call() -> None:
    inner = _Transport()
    proxy = HeadWithBody(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
    proxy.write(HEAD)
    assert inner.writes == []
    proxy.write(b"hi")
    assert inner.writes == [HEAD + b"hi"]
    proxy.write(b"more")  # not a head: at once
    assert inner.writes == [HEAD + b"hi", b"more"]
    await asyncio.sleep(0)  # the scheduled flush finds nothing held
    assert inner.writes == [HEAD + b"hi", b"more"]


async def test_a_head_without_a_body_leaves_at_the_next_loop_turn_or_before_close() -> None:
    inner = _Transport()
    proxy = HeadWithBody(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
    proxy.write(HEAD)
    await asyncio.sleep(0)
    assert inner.writes == [HEAD]
    proxy.write(HEAD)
    proxy.close()
    assert inner.writes == [HEAD, HEAD] and inner.closed
    assert proxy.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the transport's


async def _numbers() -> Any:
    for i in range(50):
        yield f"data: {i}\n\n".encode()
        if i % 10 == 0:
            await asyncio.sleep(0.001)


def _app() -> Starlette:
    async def plain(request: Request) -> Response:
        return PlainTextResponse("x" * 10_000)

    async def stream(request: Request) -> Response:
        return StreamingResponse(_numbers(), media_type="text/event-stream")

    async def empty(request: Request) -> Response:
        return Response(status_code=204)

    async def closing(request: Request) -> Response:
        return PlainTextResponse("bye", headers={"connection": "close"})

    routes = [
        Route(f"/{f.__name__}", f, methods=["GET", "POST", "HEAD"]) for f in (plain, stream, empty, closing)
    ]
    return Starlette(routes=routes)


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_served_app_answers_whole_and_in_order(method: str) -> None:
    with AppServer(_app()) as server, httpx.Client(base_url=server.url) as client:
        for _ in range(3):  # on one keep-alive connection
            r = client.request(method, "/plain")
            assert r.status_code == 200 and r.content == (b"x" * 10_000 if method == "GET" else b"")
            r = client.request(method, "/empty")
            assert r.status_code == 204 and r.content == b""
        r = client.get("/stream")
        assert r.content == b"".join(f"data: {i}\n\n".encode() for i in range(50))
        r = client.get("/closing")
        assert r.content == b"bye" and r.headers["connection"] == "close"
