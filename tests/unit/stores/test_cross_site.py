"""Keyless loopback servers refuse what a web page can make a browser send (issue 36, Medium): a ``text/plain``
POST from another site (no CORS preflight) put a call into a running rollout and wrote a reward through
``/api/batch``, and any ``Host`` was accepted, so DNS rebinding could read the dashboard. Real uvicorn on
loopback for the store API, the gateway and the dashboard; programs (no ``Origin``, a loopback ``Host``) and the
servers' own pages are still served."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from agentforge.dashboard.app import create_dashboard_app
from agentforge.gateway import GatewayServer
from agentforge.gateway.server import AppServer
from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore
from agentforge.testing import ScriptedUpstream
from agentforge.types import Rollout

PAGE = "http://evil.example"


@pytest.fixture
def servers(tmp_path) -> Iterator[dict[str, str]]:
    store, upstream = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}"), ScriptedUpstream()
    with (
        AppServer(create_store_app(store)) as api,
        AppServer(create_dashboard_app(store)) as dashboard,
        GatewayServer(store, upstream.router(), transport=upstream.transport()) as gateway,
    ):
        rid = store.enqueue_rollout(Rollout()).rollout_id
        upstream.add(*["hello"] * 4)
        yield {
            "store": f"http://127.0.0.1:{api.port}",
            "dashboard": f"http://127.0.0.1:{dashboard.port}",
            "gateway": gateway.url,
            "rid": rid,
            "store_obj": store,
        }
    store.close()


def _refused(resp: httpx.Response) -> bool:
    return resp.status_code == 403 and resp.json()["error"]["code"] == "cross_site_request"


def test_a_cross_site_page_cannot_write_or_call(servers) -> None:
    store, rid = servers["store_obj"], servers["rid"]
    batch = json.dumps({"items": [{"reward": {"rollout_id": rid, "value": 1.0}}]})
    plain = {"content-type": "text/plain", "origin": PAGE}
    assert _refused(httpx.post(f"{servers['store']}/api/batch", content=batch, headers=plain))
    assert store.list_rewards(rid) == []
    chat = '{"model": "policy", "messages": [{"role": "user", "content": "hi"}]}'
    url = f"{servers['gateway']}/rollouts/{rid}/v1/chat/completions"
    assert _refused(httpx.post(url, content=chat, headers=plain))
    assert _refused(httpx.post(url, content=chat, headers={"sec-fetch-site": "cross-site"}))
    assert store.list_spans(rollout_id=rid) == []
    # a program on this machine, and a page served from loopback, are served
    assert httpx.post(url, content=chat, headers={"content-type": "application/json"}).status_code == 200
    local_page = {"origin": servers["dashboard"], "content-type": "application/json"}
    assert httpx.post(f"{servers['store']}/api/batch", content=batch, headers=local_page).status_code == 200
    assert len(store.list_rewards(rid)) == 1


def test_dns_rebinding_cannot_read_the_dashboard_or_the_store(servers) -> None:
    rebound = {"host": "evil.example:8080"}
    for url in (
        servers["dashboard"] + "/runs",
        servers["store"] + "/api/rollouts",
        servers["gateway"] + "/health",
    ):
        assert _refused(httpx.get(url, headers=rebound)), url
        assert httpx.get(url, headers={"host": "localhost"}).status_code == 200, url
    assert httpx.get(servers["dashboard"] + "/runs", headers={"host": "[::1]:1"}).status_code == 200
