"""The store app's bind rule and surface (issue 16, medium 7, store part): ``create_store_app`` served by
uvicorn on every interface without a key answers only loopback; it serves no ``/docs`` or
``/openapi.json``. Real uvicorn on ``0.0.0.0``, reached through loopback and through the machine's LAN address.
"""

from __future__ import annotations

import httpx
import pytest
from fixtures_store import lan_address

from agentforge.errors import UserError
from agentforge.gateway.server import AppServer
from agentforge.stores.http import HTTPStore
from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore
from agentforge.types import Rollout

KEY = "store-key-0123456789"


@pytest.fixture
def lan() -> str:
    address = lan_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 interface to connect through")
    return address


def test_a_keyless_store_app_on_all_interfaces_answers_only_loopback(lan: str) -> None:
    with SQLStore("sqlite://") as store, AppServer(create_store_app(store), host="0.0.0.0") as server:
        local = f"http://127.0.0.1:{server.port}"
        remote = f"http://{lan}:{server.port}"
        assert httpx.post(f"{local}/api/rollouts", json={"rollout_id": "ro-local"}).status_code == 200
        for method, path in (
            ("POST", "/api/rollouts"),
            ("GET", "/api/rollouts"),
            ("GET", "/api/store/health"),
        ):
            resp = httpx.request(method, f"{remote}{path}", json={"rollout_id": "ro-remote"})
            assert resp.status_code == 403, (path, resp.text)
            assert resp.json()["error"]["code"] == "non_loopback_without_key"
            assert "API key" in resp.json()["error"]["message"]
        with HTTPStore(remote, retries=0) as client, pytest.raises(UserError, match="api_key"):
            client.enqueue_rollout(Rollout())
        assert [r.rollout_id for r in store.list_rollouts()] == ["ro-local"]


def test_a_keyed_store_app_serves_any_interface_to_key_holders_only(lan: str) -> None:
    with (
        SQLStore("sqlite://") as store,
        AppServer(create_store_app(store, api_key=KEY), host="0.0.0.0") as server,
    ):
        remote = f"http://{lan}:{server.port}"
        assert httpx.get(f"{remote}/api/rollouts").status_code == 401
        assert (
            httpx.get(f"{remote}/api/rollouts", headers={"Authorization": KEY}).status_code == 401
        )  # bare key
        with HTTPStore(remote, api_key=KEY) as client:
            assert client.enqueue_rollout(Rollout(rollout_id="ro-remote")).rollout_id == "ro-remote"


def test_the_store_app_serves_no_schema_or_docs() -> None:
    with SQLStore("sqlite://") as store, AppServer(create_store_app(store)) as server:
        for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
            assert httpx.get(f"{server.url}{path}").status_code == 404, path
        assert httpx.get(f"{server.url}/api/store/health").json() == {"ok": True}
