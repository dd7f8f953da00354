"""Helpers for the customer-service agent tests: a scripted policy behind the real gateway, a scripted
customer on its own port, and worker functions for the multi-process memory test (module level, so
spawned processes can import them)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentforge.gateway.server import AppServer, GatewayServer
from agentforge.testing import ScriptedToolCall, ScriptedTurn, ScriptedUpstream, memory_store

#: τ-retail dev task 0: Olivia Ito (zip 80218) wants order #W5442520 cancelled ("no longer needed").
OLIVIA = {"first_name": "Olivia", "last_name": "Ito", "zip": "80218"}
CANCEL = {"order_id": "#W5442520", "reason": "no longer needed"}


def call(name: str, arguments: dict[str, Any] | str) -> ScriptedTurn:
    """A scripted assistant turn with one tool call (``arguments`` sent verbatim when a string)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ScriptedTurn(tool_calls=[ScriptedToolCall(name, raw)])


@contextmanager
def scripted_gateway(turns: list[ScriptedTurn | str] = (), max_model_len: int | None = None) -> Iterator[Any]:
    """An in-memory store, a scripted policy (``policy`` → ``policy@v1``) and the real gateway in front.

    Yields:
        ``(store, upstream, gateway)``.
    """
    store = memory_store()
    upstream = ScriptedUpstream(list(turns), max_model_len=max_model_len)
    gateway = GatewayServer(store, upstream.router(), transport=upstream.transport()).start()
    try:
        yield store, upstream, gateway
    finally:
        gateway.stop()
        store.close()


@contextmanager
def scripted_customer(turns: list[ScriptedTurn | str]) -> Iterator[tuple[ScriptedUpstream, str]]:
    """A scripted customer model served on a loopback port. Yields ``(upstream, base_url)``."""
    upstream = ScriptedUpstream(list(turns))
    server: AppServer = upstream.serve()
    try:
        yield upstream, f"{server.url}/v1"
    finally:
        server.stop()


def memory_writer(path: str, writer: int, n: int, flush_every: int) -> None:
    """Writer process: add ``n`` memories, flushing (becoming the collection's owner) every ``flush_every``."""
    from agentforge.agents.customer_service.memory import MemoryStore

    store = MemoryStore(path)
    for i in range(n):
        store.add(memory_text(writer, i), memory_id=f"w{writer}-{i}", metadata={"writer": writer})
        if flush_every and (i + 1) % flush_every == 0:
            store.flush()


def memory_text(writer: int, i: int) -> str:
    """A distinct memory text per (writer, index)."""
    colours = ["red", "green", "blue", "black", "white"]
    return f"Customer {writer * 100 + i} prefers {colours[i % 5]} items and order number {writer}{i:03d}."


def memory_reader(path: str, stop_file: str, result_file: str) -> None:
    """Reader process: query while the writers run, then check every memory is the top hit of its text."""
    from agentforge.agents.customer_service.memory import MemoryStore

    store = MemoryStore(path)
    queries = 0
    while not os.path.exists(stop_file):
        store.search("customer prefers blue items", k=3)
        queries += 1
        time.sleep(0.2)  # leave the owner lock to the writers between queries
    expected = [(f"w{writer}-{i}", memory_text(writer, i)) for writer in range(4) for i in range(25)]
    tops = store.search_many([text for _, text in expected], k=1)  # one owner section for the 100 checks
    found = sum(bool(top) and top[0].memory_id == mid for (mid, _), top in zip(expected, tops, strict=True))
    Path(result_file).write_text(json.dumps({"queries": queries, "found": found, "count": store.count()}))
