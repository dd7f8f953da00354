"""The guard of ``fixtures_guard.py`` refuses real LLM endpoints a test's markers do not allow, and only those."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest
from fixtures_guard import ENGINES, LLMGuard, allowed_kinds, refusal

from agentforge.testing import ScriptedUpstream


@pytest.fixture
def listener() -> Iterator[int]:
    """A loopback TCP port that accepts connections (and nothing else)."""
    server = socket.create_server(("127.0.0.1", 0))
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def as_engine(listener: int) -> Iterator[Callable[[str], int]]:
    """Register the listener's port as a running engine of the given kind for the test's duration."""

    def register(kind: str) -> int:
        ENGINES[listener] = kind
        return listener

    yield register
    ENGINES.pop(listener, None)


def test_policy_by_marker() -> None:
    engines = {8011: "vllm", 8012: "embedded"}
    unmarked, slow, vllm = allowed_kinds(set()), allowed_kinds({"slow"}), allowed_kinds({"vllm", "slow"})
    for allowed in (unmarked, slow):
        assert "vllm engine" in (refusal(("127.0.0.1", 8011), allowed, engines) or "")
        assert "off this machine" in (refusal(("104.18.6.192", 443), allowed, engines) or "")
        assert "off this machine" in (refusal(("2606:4700::6812:7c0", 443, 0, 0), allowed, engines) or "")
    assert "embedded engine" in (refusal(("127.0.0.1", 8012), unmarked, engines) or "")
    assert refusal(("127.0.0.1", 8012), slow, engines) is None
    for address in [("127.0.0.1", 8011), ("::1", 8012, 0, 0), ("104.18.6.192", 443)]:
        assert refusal(address, vllm, engines) is None
    # Loopback fakes, IPv4-mapped loopback and Unix sockets are never refused.
    for address in [("127.0.0.1", 9999), ("::ffff:127.0.0.1", 9999, 0, 0), ("localhost", 1), "/tmp/pg.sock"]:
        assert refusal(address, unmarked, engines) is None


def test_a_real_engine_port_is_refused_and_fails_the_test(llm_guard: LLMGuard, as_engine) -> None:
    port = as_engine("vllm")
    with pytest.raises(
        ConnectionRefusedError, match=f"127.0.0.1:{port}, a real vllm engine; mark the test vllm"
    ):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    # A refusal in a background thread (a gateway forwarding upstream) whose error is swallowed still counts.
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _swallow(errors, f"http://127.0.0.1:{port}/v1/chat/completions"))
    thread.start()
    thread.join(10)
    assert isinstance(errors[0], httpx.ConnectError)
    assert len(llm_guard.refused) == 2 and all(llm_guard.nodeid in r for r in llm_guard.refused)
    llm_guard.refused.clear()  # seen: the teardown must not fail this test


def test_off_machine_is_refused_without_touching_the_network(llm_guard: LLMGuard) -> None:
    with pytest.raises(httpx.ConnectError, match="203.0.113.7:80, off this machine"):
        httpx.post("http://203.0.113.7/v1/chat/completions", json={}, timeout=30)
    assert len(llm_guard.refused) == 1
    llm_guard.refused.clear()


def test_loopback_fakes_and_in_process_transports_still_work(listener: int) -> None:
    socket.create_connection(("127.0.0.1", listener), timeout=5).close()
    upstream = ScriptedUpstream()
    upstream.add("hello")
    with upstream.serve() as server:
        body = {"model": "base", "messages": [{"role": "user", "content": "hi"}]}
        resp = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "hello"
    mock = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(204)))
    assert mock.get("http://api.openai.com/v1/models").status_code == 204


def _swallow(errors: list[BaseException], url: str) -> None:
    try:
        httpx.post(url, json={}, timeout=5)
    except httpx.HTTPError as exc:
        errors.append(exc)
