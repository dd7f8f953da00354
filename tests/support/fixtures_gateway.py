"""Fixtures for the gateway component: a scripted upstream, an in-memory store, the gateway app and
clients for it. Real-vLLM tests use ``vllm_base_url``/``vllm_model`` from ``fixtures_serving``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
from fastapi import FastAPI

from agentforge.gateway.app import create_gateway
from agentforge.gateway.server import GatewayServer
from agentforge.stores.sql import SQLStore
from agentforge.testing import ScriptedTurn, ScriptedUpstream, memory_store

GatewayFactory = Callable[..., tuple[FastAPI, ScriptedUpstream]]


@pytest.fixture(scope="session", autouse=True)
def privacy_detectors_built() -> None:
    """Every gateway masks by default and builds its detectors in a background thread (seconds, once per
    process); they are built before the first test, so no test's client timeout pays for the build."""
    from agentforge.privacy import PrivacyConfig
    from agentforge.privacy.flight import PrivacyGuard

    PrivacyGuard(PrivacyConfig()).detector  # noqa: B018 - the property waits for the build


@pytest.fixture
def gw_store() -> Iterator[SQLStore]:
    """A fresh in-memory trace store for one gateway test."""
    store = memory_store()
    yield store
    store.close()


@pytest.fixture
def make_gateway(gw_store: SQLStore) -> GatewayFactory:
    """Build ``(gateway_app, scripted_upstream)``: ``make_gateway(turns, **create_gateway_kwargs)``.

    The upstream serves version ``policy@v1`` behind the alias ``policy``, in-process.
    """

    def make(
        turns: list[ScriptedTurn | str] | None = None, **kwargs: object
    ) -> tuple[FastAPI, ScriptedUpstream]:
        upstream = ScriptedUpstream(turns or [])
        app = create_gateway(gw_store, upstream.router(), transport=upstream.transport(), **kwargs)  # type: ignore[arg-type]
        return app, upstream

    return make


@pytest.fixture
async def gw_client_for() -> AsyncIterator[Callable[[FastAPI], httpx.AsyncClient]]:
    """``gw_client_for(app)``: an httpx client calling the app in-process (closed after the test)."""
    clients: list[httpx.AsyncClient] = []

    def make(app: FastAPI) -> httpx.AsyncClient:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def served() -> Iterator[tuple[GatewayServer, ScriptedUpstream]]:
    """A gateway on a real loopback port (in-memory store at ``.store``) in front of an empty scripted engine
    (the test adds its turns)."""
    store = memory_store()
    upstream = ScriptedUpstream()
    server = GatewayServer(store, upstream.router(), transport=upstream.transport()).start()
    yield server, upstream
    server.stop()
    store.close()
