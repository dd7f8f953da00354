"""Helpers for the runtime tests (not fixtures): a gateway in front of a scripted upstream."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentforge.gateway.server import GatewayServer
from agentforge.stores.sql import SQLStore
from agentforge.testing import ScriptedTurn, ScriptedUpstream


@contextmanager
def gateway_env(
    tmp_path: Path, turns: list[ScriptedTurn | str], max_model_len: int | None = None
) -> Iterator[tuple[SQLStore, GatewayServer, ScriptedUpstream, str]]:
    """A SQLite-file store, a scripted upstream and a gateway on a free port in front of it.

    Yields:
        ``(store, gateway, upstream, store_url)``.
    """
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    store = SQLStore(url, sqlite_synchronous="NORMAL")
    upstream = ScriptedUpstream(turns, max_model_len=max_model_len)
    gateway = GatewayServer(store, upstream.router(), transport=upstream.transport()).start()
    try:
        yield store, gateway, upstream, url
    finally:
        gateway.stop()
        store.close()
