"""The leanest capture proxy: the least work any gateway that records calls token-exactly must do.

A second floor for ``benchmarks/gateway.py --lean``, between the byte-copying relay (no parsing, no capture)
and the product's gateway. For each chat call it parses the HTTP request, decodes the JSON body once, adds the
capture options (``return_token_ids``, ``logprobs``, and ``stream_options.include_usage`` on a stream),
sends it over a pooled keep-alive engine connection, decodes the engine's answer (each stream event) once,
takes the prompt's and the sampled tokens' ids, the log-probs and the text, strips what the client did not
ask for, encodes the answer once, and answers only after one durable row per call is committed (SQLite WAL,
``synchronous=FULL``, group commit in one writer thread); a stream's row is committed before its
``[DONE]``, as the gateway does.

Everything a product needs beyond that is left out on purpose: keys, routing and versions, rollout
attribution, validation of the client's body and of the ids, privacy, error answers, tool calls, other
endpoints, telemetry. So its figures bound from above what any Python gateway with durable capture can
reach on a machine, and the gap to the gateway is what those features cost. It handles the well-formed
chat calls of the benchmark's clients only; its answer to anything else (a malformed body, an engine error or
an engine stream without events) is to close the client's connection and store nothing, so a failure shows
in the benchmark's error count instead of as a stored call. Binds 127.0.0.1.

    python benchmarks/lean_capture.py PORT ENGINE_PORT DB_PATH
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import httptools
import orjson

__all__ = ["serve", "stored_rows"]

_JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
_SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_ENGINE_HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: engine\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\n\r\n"
)
_DONE = b"data: [DONE]\n\n"
_VERSION = "policy@v1"  # the name the client sees, as behind the gateway


class _Writer:
    """One thread that commits every row queued while it was committing the last batch, in one transaction,
    then resolves each row's future on the event loop (a caller is answered only after its row is durable)."""

    def __init__(self, path: str, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.queue, self.ready = loop, [], threading.Condition()
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("pragma journal_mode=wal")
        self.db.execute("pragma synchronous=full")
        self.db.execute("create table if not exists calls(seq integer primary key, path text, record blob)")
        threading.Thread(target=self._run, name="lean-writer", daemon=True).start()

    def submit(self, path: str, record: bytes) -> asyncio.Future[None]:
        done = self.loop.create_future()
        with self.ready:
            self.queue.append((path, record, done))
            self.ready.notify()
        return done

    def _run(self) -> None:
        while True:
            with self.ready:
                while not self.queue:
                    self.ready.wait()
                batch, self.queue = self.queue, []
            error: Exception | None = None
            try:
                self.db.execute("begin")
                self.db.executemany(
                    "insert into calls(path, record) values (?, ?)", [row[:2] for row in batch]
                )
                self.db.execute("commit")
            except sqlite3.Error as exc:  # the batch's callers fail; the writer keeps serving later ones
                error = exc
                if self.db.in_transaction:
                    self.db.execute("rollback")
            self.loop.call_soon_threadsafe(_resolve, [row[2] for row in batch], error)


def _resolve(futures: list[asyncio.Future[None]], error: Exception | None) -> None:
    for future in futures:
        if not future.done():
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)


class _Engine(asyncio.Protocol):
    """One keep-alive connection to the engine; each piece of a ``200`` answer's body goes to ``on_piece`` as
    it arrives (chunked transfer decoded by httptools), its end to ``on_end``; ``status`` is the last
    answer's HTTP status (the body of any other is dropped)."""

    def __init__(self) -> None:
        self.status = 0
        self.on_piece: Callable[[bytes], None] = _ignore
        self.on_end: Callable[[], None] = _nothing
        self.on_lost: Callable[[], None] = _nothing

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport
        self.parser = httptools.HttpResponseParser(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.status == 200:
            self.on_piece(body)

    def on_message_complete(self) -> None:
        self.on_end()

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_lost()


def _ignore(_: bytes) -> None:
    return None


def _nothing() -> None:
    return None


class _Proxy:
    """The proxy's state: the engine's address, the idle engine connections, the writer."""

    def __init__(self, engine_port: int, writer: _Writer, loop: asyncio.AbstractEventLoop) -> None:
        self.engine_port, self.writer, self.loop = engine_port, writer, loop
        self.idle: list[_Engine] = []

    async def engine(self) -> _Engine:
        while self.idle:
            conn = self.idle.pop()
            if not conn.transport.is_closing():
                return conn
        return (await self.loop.create_connection(_Engine, "127.0.0.1", self.engine_port))[1]

    async def call(self, client: Any, path: str, body: bytes) -> None:
        """One chat call from ``client`` (a transport): forward, capture, commit, answer."""
        request = orjson.loads(body)
        stream = bool(request.get("stream"))
        request["model"], request["return_token_ids"], request["logprobs"] = "base", True, True
        if stream:
            request["stream_options"] = {**(request.get("stream_options") or {}), "include_usage": True}
        data = orjson.dumps(request)
        conn = await self.engine()
        end: asyncio.Future[None] = self.loop.create_future()
        capture = _StreamCapture(client) if stream else None
        pieces: list[bytes] = []
        conn.on_piece = capture.feed if capture is not None else pieces.append
        conn.on_end = lambda: end.done() or end.set_result(None)
        conn.on_lost = lambda: (
            end.done() or end.set_exception(ConnectionError("engine closed the connection"))
        )
        conn.transport.write(_ENGINE_HEAD % len(data) + data)
        try:
            await end
        except ConnectionError:
            client.close()
            return
        conn.on_piece, conn.on_end, conn.on_lost = _ignore, _nothing, _nothing
        self.idle.append(conn)
        if conn.status != 200 or (capture is not None and not capture.started):  # nothing to store
            client.close()
            return
        if capture is not None:
            await self.writer.submit(path, capture.record(request))
            client.write(_chunk(_DONE) + b"0\r\n\r\n")
            return
        answer = orjson.loads(b"".join(pieces))
        choice = answer["choices"][0]
        ids = choice.pop("token_ids", None)
        prompt_ids = answer.pop("prompt_token_ids", None) or choice.pop("prompt_token_ids", None)
        logprobs = choice.get("logprobs")
        choice["logprobs"] = None
        answer["model"] = _VERSION
        lps = [entry["logprob"] for entry in logprobs["content"]] if logprobs else None
        record = _record(request, choice["message"].get("content"), prompt_ids, ids, lps, answer.get("usage"))
        await self.writer.submit(path, record)
        out = orjson.dumps(answer)
        client.write(_JSON_HEAD % len(out) + out)


def _record(
    request: dict[str, Any],
    text: str | None,
    prompt_ids: list[int] | None,
    ids: list[int] | None,
    logprobs: list[float] | None,
    usage: dict[str, Any] | None,
) -> bytes:
    """One call's row: what the engine was asked, and the text, ids, log-probs and usage it answered."""
    return orjson.dumps(
        {
            "request": request,
            "text": text,
            "prompt_ids": prompt_ids,
            "ids": ids,
            "logprobs": logprobs,
            "usage": usage,
            "time": time.time(),
        }
    )


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _StreamCapture:
    """A stream's events as they arrive: each decoded once, captured, stripped of the capture options'
    fields, encoded once; the events of each piece from the engine go to the client in one write."""

    def __init__(self, client: Any) -> None:
        self.client, self.buffer = client, b""
        self.prompt_ids: list[int] | None = None
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.text: list[str] = []
        self.usage: dict[str, Any] | None = None
        self.started = False

    def feed(self, piece: bytes) -> None:
        # events end with a blank line written as "\n\n", as vLLM writes them ("\r\n\r\n" is not read)
        *events, self.buffer = (self.buffer + piece).split(b"\n\n")
        out = []
        for event in events:
            payload = event[6:]
            if not payload or payload == b"[DONE]":
                continue
            chunk = orjson.loads(payload)
            if "prompt_token_ids" in chunk:
                self.prompt_ids = chunk.pop("prompt_token_ids")
            if not chunk["choices"]:  # the usage chunk the capture options asked for
                self.usage = chunk.get("usage")
                continue
            choice = chunk["choices"][0]
            self.ids.extend(choice.pop("token_ids", None) or ())
            logprobs = choice.get("logprobs")
            if logprobs:
                self.logprobs.extend(entry["logprob"] for entry in logprobs["content"])
                choice["logprobs"] = None
            if content := choice.get("delta", {}).get("content"):
                self.text.append(content)
            chunk["model"] = _VERSION
            out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if out:
            data = _chunk(b"".join(out))
            self.client.write(data if self.started else _SSE_HEAD + data)
            self.started = True

    def record(self, request: dict[str, Any]) -> bytes:
        return _record(request, "".join(self.text), self.prompt_ids, self.ids, self.logprobs, self.usage)


class _Client(asyncio.Protocol):
    """One client connection: each request is handled as a task once its body is complete; a ``GET`` (the
    benchmark's start-up probe) gets ``{}``."""

    def __init__(self, proxy: _Proxy) -> None:
        self.proxy = proxy
        self.parser = httptools.HttpRequestParser(self)
        self.url, self.body = b"", []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        url, body = self.url, b"".join(self.body)
        self.url, self.body = b"", []
        if self.parser.get_method() != b"POST":
            self.transport.write(_JSON_HEAD % 2 + b"{}")
            return
        task = self.proxy.loop.create_task(self.proxy.call(self.transport, url.decode("latin-1"), body))
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:  # not a call it handles: no answer
            self.transport.close()


async def serve(port: int, engine_port: int, db_path: str) -> None:
    """Serve on 127.0.0.1:``port`` forever, forwarding to the engine on 127.0.0.1:``engine_port`` and
    recording one row per call into the SQLite file ``db_path`` (table ``calls``)."""
    loop = asyncio.get_running_loop()
    proxy = _Proxy(engine_port, _Writer(db_path, loop), loop)
    server = await loop.create_server(lambda: _Client(proxy), "127.0.0.1", port)
    await server.serve_forever()


def stored_rows(db_path: str) -> int:
    """How many calls ``db_path`` holds (0 before the proxy created it; the file is not created)."""
    if not Path(db_path).exists():
        return 0
    with closing(sqlite3.connect(db_path)) as db:
        try:
            return int(db.execute("select count(*) from calls").fetchone()[0])
        except sqlite3.OperationalError:  # the proxy has not created its table yet
            return 0


def main(argv: list[str]) -> None:
    """``PORT ENGINE_PORT DB_PATH``: serve on the gateway's event loop (uvloop where installed)."""
    port, engine_port, db_path = int(argv[0]), int(argv[1]), argv[2]
    try:
        from uvloop import run
    except ImportError:
        run = asyncio.run
    run(serve(port, engine_port, db_path))


if __name__ == "__main__":
    main(sys.argv[1:])
