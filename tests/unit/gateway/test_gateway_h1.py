"""The gateway's lean HTTP/1.1 upstream client (agentforge.gateway.h1) against raw socket servers that
misbehave on purpose: idle connections closed by the engine, stalls, broken streams, garbage, cancels."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from agentforge.gateway.h1 import H1Broken, H1Client, H1Timeout

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


def _ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


async def _serve(handler: Handler) -> tuple[asyncio.Server, str, list[int]]:
    connections: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1/chat/completions", connections


async def test_keep_alive_connection_is_reused_and_request_is_framed() -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seen.append(await _read_request(reader))
            writer.write(_ok(b'{"ok":true}'))
            await writer.drain()

    server, url, connections = await _serve(handler)
    client = H1Client(read_s=5)
    for i in range(5):
        answer = await client.post(url, b'{"i":%d}' % i, {"authorization": "Bearer k"}, stream=False)
        assert (answer.status, answer.body) == (200, b'{"ok":true}')
    assert len(connections) == 1
    assert seen[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"authorization: Bearer k\r\n" in seen[0] and seen[0].endswith(b'\r\n\r\n{"i":0}')
    await client.aclose()
    server.close()


async def test_idle_connection_closed_by_engine_is_retried_once_on_a_new_one() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_ok(b"{}"))  # keep-alive promised, then the connection is closed while idle
        await writer.drain()

    server, url, connections = await _serve(handler)
    client = H1Client(read_s=5)
    assert (await client.post(url, b"{}", {}, stream=False)).status == 200
    await asyncio.sleep(0.05)  # the engine's close reached us... or not yet: both must work
    assert (await client.post(url, b"{}", {}, stream=False)).status == 200
    assert len(connections) == 2
    await client.aclose()
    server.close()


async def test_a_call_the_engine_answered_then_broke_is_not_sent_again() -> None:
    calls: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        calls.append(1)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()

    server, url, _ = await _serve(handler)
    client = H1Client(read_s=5)
    with pytest.raises(H1Broken):
        await client.post(url, b"{}", {}, stream=False)
    assert calls == [1]
    server.close()


async def test_stalled_engine_times_out_and_connection_is_dropped() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(10)

    server, url, _ = await _serve(handler)
    client = H1Client(read_s=0.3)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(H1Timeout):
        await client.post(url, b"{}", {}, stream=False)
    assert 0.25 < loop.time() - t0 < 2
    assert not any(pool.idle for pool in client._pools.values())
    server.close()


async def test_unreachable_engine_and_garbage_answers_are_broken() -> None:
    client = H1Client(read_s=1, connect_s=1)
    server, url, _ = await _serve(lambda r, w: asyncio.sleep(0))
    server.close()
    await server.wait_closed()
    with pytest.raises(H1Broken):
        await client.post(url, b"{}", {}, stream=False)

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    server, url, _ = await _serve(garbage)
    with pytest.raises(H1Broken, match="not valid HTTP"):
        await client.post(url, b"{}", {}, stream=False)
    server.close()


async def test_chunked_stream_is_dechunked_pooled_at_its_end_and_closed_when_left_early() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            for event in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    server, url, connections = await _serve(handler)
    client = H1Client(read_s=5)
    answer = await client.post(url, b"{}", {}, stream=True)
    body = b"".join([block async for block in answer.blocks()])
    answer.close()
    assert body == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    answer = await client.post(url, b"{}", {}, stream=True)  # the same connection, back from the pool
    assert len(connections) == 1
    async for _ in answer.blocks():
        break
    answer.close()  # left early: this connection cannot carry another call
    assert not any(pool.idle for pool in client._pools.values())
    answer = await client.post(url, b"{}", {}, stream=False)
    assert answer.body == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n" and len(connections) == 2
    server.close()


async def test_stream_that_breaks_midway_raises_broken_and_a_cancelled_call_closes_its_connection() -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_request(reader)
        if b'"hang"' in request:
            await reader.read()  # returns when the client closes
            closed.set()
            return
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()

    server, url, _ = await _serve(handler)
    client = H1Client(read_s=5)
    answer = await client.post(url, b"{}", {}, stream=True)
    blocks = []
    with pytest.raises(H1Broken):
        async for block in answer.blocks():
            blocks.append(block)
    assert blocks == [b"hello"]
    task = asyncio.ensure_future(client.post(url, b'"hang"', {}, stream=False))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(closed.wait(), 2)
    server.close()


async def test_chunks_that_arrive_together_are_read_as_one_piece() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        events = (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n")
        writer.write(head + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    server, url, _ = await _serve(handler)
    client = H1Client(read_s=5)
    answer = await client.post(url, b"{}", {}, stream=True)
    await asyncio.sleep(0.1)  # every chunk has arrived: one read hands them all out
    assert await answer.read() == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    assert await answer.read() == b"" and await answer.read() == b""
    answer.close()
    server.close()


@pytest.mark.parametrize("terminator_after_s", [0.1, None])
async def test_a_stream_closed_after_its_last_event_finishes_in_the_background(
    terminator_after_s: float | None,
) -> None:
    """``close(finish_s)`` returns at once; the connection goes back to the pool when the closing chunk comes
    within ``finish_s``, and is closed (never reused half-read) when it does not."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\ne\r\ndata: [DONE]\n\n\r\n")
            await writer.drain()
            if terminator_after_s is None:
                await reader.read()
                return
            await asyncio.sleep(terminator_after_s)
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    server, url, connections = await _serve(handler)
    client = H1Client(read_s=5)
    answer = await client.post(url, b"{}", {}, stream=True)
    assert await answer.read() == b"data: [DONE]\n\n"
    answer.close(finish_s=0.5)
    (pool,) = client._pools.values()
    assert not pool.idle  # not yet: the closing chunk is on its way
    await asyncio.sleep(0.8)
    if terminator_after_s is None:
        assert not pool.idle and not answer._conn.open
    else:
        assert len(pool.idle) == 1
        answer = await client.post(url, b"{}", {}, stream=True)
        assert await answer.read() == b"data: [DONE]\n\n" and len(connections) == 1
        answer.close(finish_s=0.5)
    server.close()
