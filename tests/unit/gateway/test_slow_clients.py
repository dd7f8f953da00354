"""Slow clients (issue 36, low: 400 connections that sent their request a byte at a time were held past 100 s).

Real components: the store API (``create_store_app`` on SQLite) under agentforge's uvicorn server
(:class:`~agentforge.gateway.server.AppServer`, the one the gateway runs on) with a 1 s read timeout, raw sockets.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import httpx
import pytest

from agentforge.gateway.server import AppServer
from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (recv gives b''), or ``None`` if it is still open after ``seconds``."""
    t0 = time.monotonic()
    sock.settimeout(seconds)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return time.monotonic() - t0
    except TimeoutError:
        return None
    except ConnectionResetError:
        return time.monotonic() - t0


@pytest.fixture
def served(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("agentforge.gateway.server.HTTP_KEEP_ALIVE_S", 2)
    with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as store:
        with AppServer(create_store_app(store), read_timeout_s=1.0) as server:
            yield server, store


def test_a_request_that_trickles_in_is_cut_and_writes_nothing(served) -> None:
    server, store = served
    head_only = socket.create_connection(("127.0.0.1", server.port))
    head_only.sendall(b"POST /api/spans HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
    body = b'{"kind": "custom", "name": "slow"}'
    half_body = socket.create_connection(("127.0.0.1", server.port))
    half_body.sendall(
        b"POST /api/spans HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body[:10]
    )
    drip = socket.create_connection(("127.0.0.1", server.port))
    for byte in b"POST /api/spans HTTP/1.1\r\nHost: 127.0.0.1\r\n":  # a byte every 0.1 s keeps no timer alive
        try:
            drip.sendall(bytes([byte]))
        except OSError:
            break
        time.sleep(0.1)
    for sock in (head_only, half_body):
        closed = _closed_within(sock, 5.0)
        assert closed is not None, "the server kept a connection whose request never finished arriving"
        sock.close()
    assert _closed_within(drip, 5.0) is not None
    drip.close()
    assert store.list_spans() == []


def test_a_silent_connection_is_closed_and_idle_keep_alive_is_not_a_read_timeout(served) -> None:
    server, _ = served
    silent = socket.create_connection(("127.0.0.1", server.port))
    closed = _closed_within(silent, 6.0)
    assert closed is not None and closed >= 1.5, closed  # after the (patched) 2 s keep-alive, not at once
    silent.close()
    with httpx.Client(base_url=server.url) as client:  # a kept-alive connection idle past the read timeout
        assert client.get("/api/store/health").status_code == 200
        time.sleep(1.5)
        assert client.get("/api/store/health").status_code == 200


def test_a_slow_answer_is_not_cut_by_the_read_timeout() -> None:
    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        await receive()
        await asyncio.sleep(2.0)  # twice the read timeout: the request arrived whole, the answer is the app's
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    with AppServer(app, read_timeout_s=1.0) as server:
        resp = httpx.post(server.url, content=b"x" * 100, timeout=10)
        assert resp.status_code == 200 and resp.text == "ok"


def test_four_hundred_trickling_connections_are_all_cut_while_the_server_keeps_answering(served) -> None:
    """The report's own scale: 400 connections whose request never finishes arriving (half of them a head
    that never ends, half a head and part of a body) are all closed within seconds of the 1 s read timeout,
    the server answers a whole request meanwhile, and nothing is written."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:  # 400 client sockets and the server's 400 in this one process
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    # a host whose hard limit is 1,024 descriptors holds 384 at once
    count = min(400, (resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 256) // 2)
    server, store = served
    body = b'{"kind": "custom", "name": "slow"}'
    heads = (
        b"POST /api/spans HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        b"POST /api/spans HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body[:10],
    )
    socks = []
    try:
        for i in range(count):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(heads[i % 2])
            socks.append(sock)
        with httpx.Client(base_url=server.url, timeout=10) as client:
            assert client.get("/api/store/health").status_code == 200
        deadline = time.monotonic() + 20.0
        still_open = [s for s in socks if _closed_within(s, max(0.01, deadline - time.monotonic())) is None]
        assert still_open == [], f"{len(still_open)} of {count} connections were kept past 20 s"
        with httpx.Client(base_url=server.url, timeout=10) as client:
            assert client.get("/api/store/health").status_code == 200
    finally:
        for sock in socks:
            sock.close()
    assert store.list_spans() == []
