"""Property-based fuzzing of the store API as a tenant (issue 36, must-show): whatever tenant ``acme`` sends —
any route and method, any JSON naming ``bolt``'s rollout, span, reward or attempt ids, its tenant or its
lineage — the answer is never a bare 500, and nothing of ``bolt``'s (its marker text, its record's ids beyond
those acme sent) comes back; ``bolt``'s records are unchanged afterwards."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fuzzing import FUZZ, json_values
from hypothesis import given, settings
from hypothesis import strategies as st

from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore
from agentforge.stores.tenants import TenantKeyCache
from agentforge.types import ResourceVersion, Reward, Rollout, Span

_SETTINGS = settings(FUZZ, max_examples=300)
MARKER = "bolt-private-marker-7c1"
STORE_KEY, ADMIN_KEY = "fuzz-store-key-0123456789", "fuzz-admin-key-0123456789"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    store = SQLStore(f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'traces.db'}")
    app = create_store_app(
        store, api_key=STORE_KEY, admin_key=ADMIN_KEY, tenants=TenantKeyCache(store.tenant_keys)
    )
    key_a = store.tenant_keys.issue("acme")
    store.tenant_keys.issue("bolt")
    rb = store.enqueue_rollout(Rollout(tenant="bolt", metadata={"m": MARKER}))
    sb = store.add_span(Span(rollout_id=rb.rollout_id, tenant="bolt", attributes={"m": MARKER}))
    wb = store.add_reward(Reward(rollout_id=rb.rollout_id, tenant="bolt", value=1.0, metadata={"m": MARKER}))
    store.publish_resource(ResourceVersion(name="policy@bolt", kind="other", payload={"m": MARKER}))
    claimed = store.claim_rollout("w-bolt")
    assert claimed is not None
    ra = store.enqueue_rollout(Rollout(tenant="acme"))
    ids = {
        "rollout": rb.rollout_id,
        "span": sb.span_id,
        "reward": wb.reward_id,
        "attempt": claimed[1].attempt_id,
    }
    yield store, app, key_a, ids, ra.rollout_id
    store.close()


def _send(app, method: str, path: str, key: str, body: bytes | None, params: dict) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            headers = {"X-Api-Key": key, "content-type": "application/json"}
            return await client.request(method, path, content=body, params=params, headers=headers)

    return asyncio.run(call())


_foreign = st.sampled_from(["rollout", "span", "reward", "attempt", "tenant", "lineage", "own", "random"])
_json = json_values(max_leaves=8, max_text=20)


def _value(kind: str, ids: dict[str, str], own: str) -> object:
    named = {
        "tenant": "bolt",
        "acme": "acme",
        "lineage": "policy@bolt/v1",
        "own": own,
        "random": "ro-0000000000000000",
    }
    return named.get(kind, ids.get(kind, kind))


_fields = st.fixed_dictionaries(
    {},
    optional={
        "rollout_id": st.sampled_from(["rollout", "own", "random"]),
        "span_id": st.sampled_from(["span", "random"]),
        "reward_id": st.sampled_from(["reward", "random"]),
        "attempt_id": st.sampled_from(["attempt", "random"]),
        "tenant": st.sampled_from(["tenant", "acme"]),
        "name": st.sampled_from(["lineage", "policy@bolt", "privacy:deletions"]),
        "resources": st.one_of(st.just({"policy": "policy@bolt/v1"}), _json),
        "value": _json,
        "final": _json,
        "state": _json,
        "metadata": _json,
        "kind": _json,
        "worker_id": _json,
    },
)
_ROUTES = [
    ("POST", "/api/rollouts"),
    ("GET", "/api/rollouts"),
    ("GET", "/api/rollouts/{rollout}"),
    ("GET", "/api/rollouts/{rollout}/attempts"),
    ("GET", "/api/rollouts/{rollout}/rewards"),
    ("GET", "/api/rollouts/{rollout}/final_reward"),
    ("POST", "/api/spans"),
    ("GET", "/api/spans"),
    ("POST", "/api/rewards"),
    ("POST", "/api/batch"),
    ("GET", "/api/resources"),
    ("GET", "/api/resources/version"),
    ("POST", "/api/resources"),
    ("POST", "/api/resources/activate"),
    ("POST", "/api/rollouts/claim"),
    ("POST", "/api/attempts/{attempt}/heartbeat"),
    ("POST", "/api/attempts/{attempt}/finish"),
    ("GET", "/api/rollouts/page"),
    ("GET", "/api/store/metrics"),
]


@_SETTINGS
@given(
    route=st.sampled_from(_ROUTES),
    fields=_fields,
    wrap=st.sampled_from(["plain", "batch"]),
    query=st.dictionaries(
        st.sampled_from(["rollout_id", "tenant", "name", "attempt_id"]), _foreign, max_size=2
    ),
)
def test_a_tenant_never_reads_or_changes_another_tenants_records(world, route, fields, wrap, query) -> None:
    method, route = route
    store, app, key_a, ids, own = world
    resolved = {
        k: _value(v, ids, own) if isinstance(v, str) and v in _FOREIGN_KINDS else v for k, v in fields.items()
    }
    body: object = resolved
    if wrap == "batch" and route == "/api/batch":
        body = {"items": [{"span": resolved}, {"reward": resolved}], "ack": "full"}
    path = route.format(rollout=ids["rollout"], attempt=ids["attempt"])
    params = {k: _value(v, ids, own) for k, v in query.items()}
    try:
        raw = json.dumps(body).encode()
    except (TypeError, ValueError):
        raw = b"{}"
    response = _send(app, method, path, key_a, raw if method == "POST" else None, params)
    assert response.status_code != 500, response.text[:300]
    assert MARKER not in response.text, (path, response.text[:300])
    for kind in ("span", "reward", "attempt"):  # bolt's ids come back only where acme sent them
        if ids[kind] not in raw.decode() + json.dumps(params) + path:
            assert ids[kind] not in response.text, (kind, path, response.text[:300])
    # bolt's records are as they were
    assert store.get_rollout(ids["rollout"]).tenant == "bolt"
    assert [s.attributes for s in store.list_spans(rollout_id=ids["rollout"])] == [{"m": MARKER}]
    assert [r.value for r in store.list_rewards(ids["rollout"])] == [1.0]


_FOREIGN_KINDS = frozenset(
    ["rollout", "span", "reward", "attempt", "tenant", "acme", "lineage", "own", "random"]
)
