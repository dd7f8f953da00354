"""The embedded backend under a hostile or broken client: abandoned streams must not wedge the engine."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from adapters import LETTER_MESSAGES

from agentforge.serving.embedded import EmbeddedServer

pytest.importorskip("peft")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer()
    server.start()
    yield server
    server.stop()


def abandon_stream(server: EmbeddedServer, body: bytes) -> None:
    """Send a streamed chat request on a raw socket, read its first SSE event, then close the socket."""
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {server.host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
    )
    head += "".join(f"{k}: {v}\r\n" for k, v in server.auth_headers().items())
    with socket.create_connection((server.host, server.port), timeout=60) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        seen = b""
        while b"data: " not in seen:
            chunk = sock.recv(4096)
            assert chunk, f"the server closed the stream before its first event: {seen!r}"
            seen += chunk
        assert seen.startswith(b"HTTP/1.1 200"), seen[:200]


def test_abandoned_stream_frees_the_engine(engine: EmbeddedServer) -> None:
    import json

    long_stream = {
        "model": "base",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 400,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    short = {
        "model": "base",
        "messages": LETTER_MESSAGES,
        "max_tokens": 2,
        "temperature": 0,
        "return_token_ids": True,
    }
    with httpx.Client(headers=engine.auth_headers(), timeout=60) as client:
        t0 = time.monotonic()
        assert client.post(f"{engine.base_url}/chat/completions", json=short).status_code == 200
        normal_s = time.monotonic() - t0
        for _ in range(2):  # twice: the first abandoned stream must not leave anything behind either
            abandon_stream(engine, json.dumps(long_stream).encode())
            t0 = time.monotonic()
            # 400 tokens take far longer than this on 2 CPU cores; a wedged engine never answers (issue 16).
            answer = client.post(f"{engine.base_url}/chat/completions", json=short, timeout=30)
            waited_s = time.monotonic() - t0
            assert answer.status_code == 200, answer.text
            assert len(answer.json()["choices"][0]["token_ids"]) <= 2
            assert waited_s < normal_s + 10, (
                f"waited {waited_s:.1f}s after an abandoned stream (normal {normal_s:.1f}s)"
            )


def test_engine_port_needs_the_serving_key(engine: EmbeddedServer) -> None:
    body = {"model": "base", "messages": LETTER_MESSAGES, "max_tokens": 1}
    url = f"{engine.base_url}/chat/completions"
    assert engine.api_key and len(engine.api_key) >= 32
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": engine.api_key}):
        refused = httpx.post(url, json=body, headers=headers, timeout=30)
        assert refused.status_code == 401, (headers, refused.text)
        assert refused.json()["error"]["code"] == 401
    assert httpx.get(f"{engine.base_url}/models", timeout=10).status_code == 401
    assert httpx.post(f"{engine.base_url}/completions", json=body, timeout=10).status_code == 401
    assert httpx.get(f"http://{engine.host}:{engine.port}/health", timeout=10).status_code == 200
    answer = httpx.post(url, json=body, headers=engine.auth_headers(), timeout=60)
    assert answer.status_code == 200, answer.text


def test_prompt_token_ids_outside_the_vocabulary_are_a_400(engine: EmbeddedServer) -> None:
    """Issue 36, Low: bad prompt token ids on the embedded engine were a 500 (the model's index error)."""
    url = f"{engine.base_url}/completions"
    for ids in ([1, 2, 10**9], [-1], [49152]):  # SmolLM2's vocabulary is 49,152 ids
        r = httpx.post(
            url,
            json={"model": "base", "prompt": ids, "max_tokens": 1},
            headers=engine.auth_headers(),
            timeout=60,
        )
        assert r.status_code == 400 and "outside the model's vocabulary" in r.text, (ids, r.text)
    ok = httpx.post(
        url,
        json={"model": "base", "prompt": [1, 2, 3], "max_tokens": 1},
        headers=engine.auth_headers(),
        timeout=60,
    )
    assert ok.status_code == 200, ok.text
