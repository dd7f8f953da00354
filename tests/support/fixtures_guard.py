"""Tests never reach a real LLM by accident (STYLE 12): an autouse guard on every TCP connection.

While a test runs, each TCP connection that any thread of this process opens (``socket.socket.connect``, which
httpx/httpcore, the OpenAI SDK, asyncio and psycopg all go through) is checked against the test's markers:

* **off this machine** (not loopback, nor an address of one of this machine's interfaces): refused unless the test is marked ``vllm`` (``AGENTFORGE_TEST_VLLM_URL``
  may name another machine) — hosted LLM APIs, and the network in general, are never reached;
* **a vLLM engine** (a :class:`~agentforge.serving.vllm.VLLMServer` from its ``start`` until its ``stop``, one
  attached with ``VLLMServer.connect``, or the server at ``AGENTFORGE_TEST_VLLM_URL``): refused unless ``vllm``;
* **the embedded engine** (an :class:`~agentforge.serving.embedded.EmbeddedServer`, the real model in this
  process): refused unless the test is marked ``slow`` or ``vllm``.

Loopback fakes (``ScriptedUpstream.serve()``, gateways, store servers, PostgreSQL) connect as before, and
in-process transports (``httpx.MockTransport``, ``httpx.ASGITransport``, FastAPI's ``TestClient``) open no
socket at all. A refused connection raises :class:`ConnectionRefusedError` where it was opened, and the test
fails at teardown naming the endpoint, even when the refusal happened in a background thread (a gateway
forwarding upstream, a runner worker) whose error was swallowed. Child processes are not covered; they get
no ``OPENAI_API_KEY`` (``conftest.py``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

__all__ = ["ENGINES", "LLMGuard", "allowed_kinds", "refusal"]

#: Loopback ports where a real engine listens now → its kind (``"vllm"`` or ``"embedded"``).
ENGINES: dict[int, str] = {}
_ENGINES_LOCK = threading.Lock()
#: Which engine kinds each marker lets a test reach.
_MARKER_KINDS = {"vllm": {"vllm", "embedded", "remote"}, "slow": {"embedded"}}


def allowed_kinds(markers: set[str]) -> set[str]:
    """The endpoint kinds (``"vllm"``, ``"embedded"``, ``"remote"``) a test with these markers may reach."""
    return set().union(*(_MARKER_KINDS.get(m, set()) for m in markers))


def _own_addresses() -> frozenset[str]:
    """The addresses of this machine's own interfaces (a connection to one never leaves the machine)."""
    try:
        import psutil
    except ImportError:
        return frozenset()
    return frozenset(
        a.address.split("%", 1)[0]
        for addresses in psutil.net_if_addrs().values()
        for a in addresses
        if a.family in (socket.AF_INET, socket.AF_INET6)
    )


_OWN = _own_addresses()


def _is_local(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host == "localhost" or host.endswith(".localhost")
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified or str(ip) in _OWN


def refusal(address: Any, allowed: set[str], engines: dict[int, str] | None = None) -> str | None:
    """Why connecting to ``address`` must be refused for a test allowed ``allowed`` kinds; ``None``: go ahead.

    Args:
        address: what ``socket.connect`` got: ``(host, port)`` / ``(host, port, flow, scope)`` for TCP,
            a path for a Unix socket (always allowed).
        allowed: from :func:`allowed_kinds`.
        engines: loopback port → engine kind (default: :data:`ENGINES`).
    """
    if not isinstance(address, tuple) or len(address) < 2 or not isinstance(address[0], str):
        return None
    host, port = address[0], int(address[1])
    if not _is_local(host):
        return None if "remote" in allowed else f"{host}:{port}, off this machine (a hosted API?)"
    kind = (ENGINES if engines is None else engines).get(port)
    if kind is not None and kind not in allowed:
        return f"{host}:{port}, a real {kind} engine"
    return None


class LLMGuard:
    """The current test's guard: what it may reach and what it was refused (``refused``, one line each)."""

    def __init__(self, nodeid: str, markers: set[str]) -> None:
        self.nodeid, self.markers, self.allowed = nodeid, markers, allowed_kinds(markers)
        self.refused: list[str] = []
        self._ports: list[int] = []

    def forgive(self, port: int) -> None:
        """Drop the refusals of ``port``: an engine whose start failed never listened there, so its own
        readiness checks reached nothing."""
        kept = [(p, m) for p, m in zip(self._ports, self.refused, strict=True) if p != port]
        self._ports, self.refused = [p for p, _ in kept], [m for _, m in kept]

    def check(self, address: Any) -> None:
        """Raise :class:`ConnectionRefusedError` (and remember why) if ``address`` is off limits."""
        why = refusal(address, self.allowed)
        if why is not None:
            need = "vllm" if "real embedded" not in why else "slow (or vllm)"
            message = f"{self.nodeid} tried to reach {why}; mark the test {need} or use a fake upstream"
            self.refused.append(message)
            self._ports.append(int(address[1]))
            raise ConnectionRefusedError(message)


#: The running test's guard (a list so that start wrappers made at session start can find it).
_CURRENT: list[LLMGuard] = []


def _register(port: int, kind: str) -> None:
    with _ENGINES_LOCK:
        ENGINES[port] = kind


def _unregister(port: int) -> None:
    with _ENGINES_LOCK:
        ENGINES.pop(port, None)


def _tracking(
    kind: str, start: Callable[..., Any], stop: Callable[..., Any]
) -> tuple[Callable[..., Any], ...]:
    """``start``/``stop`` wrappers that register the engine's port for as long as it may listen."""

    def tracked_start(self: Any, *args: Any, **kwargs: Any) -> Any:
        _register(int(self.port), kind)  # before start: its own health checks count too
        try:
            return start(self, *args, **kwargs)
        except BaseException:
            _unregister(int(self.port))
            for guard in _CURRENT:
                guard.forgive(int(self.port))
            raise

    def tracked_stop(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return stop(self, *args, **kwargs)
        finally:
            if getattr(self, "_owned", True):  # an attached server keeps running after stop()
                _unregister(int(self.port))

    return tracked_start, tracked_stop


@pytest.fixture(scope="session", autouse=True)
def _track_engines() -> Iterator[None]:
    """Keep :data:`ENGINES` current: wrap the engines' ``start``/``stop`` and ``VLLMServer.connect``."""
    from agentforge.serving.embedded import EmbeddedServer
    from agentforge.serving.vllm import VLLMServer

    url = os.environ.get("AGENTFORGE_TEST_VLLM_URL")
    if url and urlsplit(url).port:
        _register(int(urlsplit(url).port or 0), "vllm")
    connect = VLLMServer.connect.__func__  # type: ignore[attr-defined]

    def tracked_connect(cls: type, base_url: str, **kwargs: Any) -> Any:
        port = urlsplit(base_url).port
        if port:
            _register(port, "vllm")
        return connect(cls, base_url, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        for cls, kind in ((VLLMServer, "vllm"), (EmbeddedServer, "embedded")):
            start, stop = _tracking(kind, cls.start, cls.stop)
            mp.setattr(cls, "start", start)
            mp.setattr(cls, "stop", stop)
        mp.setattr(VLLMServer, "connect", classmethod(tracked_connect))
        yield


@pytest.fixture(autouse=True)
def llm_guard(request: pytest.FixtureRequest) -> Iterator[LLMGuard]:
    """Refuse connections to real LLM endpoints the test's markers do not allow; fail the test if it tried."""
    markers = {m.name for m in request.node.iter_markers()}
    guard = LLMGuard(request.node.nodeid, markers)
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guarded_connect(sock: socket.socket, address: Any) -> None:
        guard.check(address)
        return connect(sock, address)

    def guarded_connect_ex(sock: socket.socket, address: Any) -> int:
        guard.check(address)
        return connect_ex(sock, address)

    _CURRENT.append(guard)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(socket.socket, "connect", guarded_connect)
            mp.setattr(socket.socket, "connect_ex", guarded_connect_ex)
            yield guard
    finally:
        _CURRENT.remove(guard)
    if guard.refused:
        pytest.fail("real LLM endpoint reached by accident:\n" + "\n".join(dict.fromkeys(guard.refused)))
