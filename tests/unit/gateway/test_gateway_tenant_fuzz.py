"""Property-based fuzzing of the gateway's LLM routes as a tenant (issue 36, "fuzz pass over tenancy"):
whatever tenant ``acme`` sends to any dialect's route — bodies naming ``bolt``'s versions or its lineage as
the model, ``bolt``'s rollout in the URL prefix or the headers, an ``X-Tenant: bolt`` header, any JSON — the
answer is never a bare 500, ``bolt``'s engine serves none of it, no span is attached to ``bolt``'s rollout or
tenant, and nothing of ``bolt``'s (its engine's text, its version names) comes back.

Real gateway app (in-process), real SQLite store and tenant keys; each version's engine is scripted.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fuzzing import FUZZ, json_values
from gateway_helpers import ByHostTransport, tenant_router
from hypothesis import given, settings
from hypothesis import strategies as st

from agentforge.gateway.app import create_gateway
from agentforge.privacy import PrivacyConfig
from agentforge.stores.tenants import TenantKeyCache
from agentforge.testing import ScriptedUpstream, memory_store
from agentforge.types import Rollout

_SETTINGS = settings(FUZZ, max_examples=150)
GATEWAY_KEY = "tenant-fuzz-gateway-key-0123"
BOLT_TEXT = "bolt-private-answer-5e2"


@pytest.fixture(scope="module")
def world():
    """acme and bolt each have a live adapter behind their own engine; bolt has a rollout; the shared base
    serves tenants without a lineage."""
    engines = {
        "shared": ScriptedUpstream(["from shared"], model="shared-model", cycle=True),
        "acme": ScriptedUpstream(["from acme"], model="acme-model", cycle=True),
        "bolt": ScriptedUpstream([BOLT_TEXT], model="bolt-model", cycle=True),
    }
    router = tenant_router(engines)
    store = memory_store()
    app = create_gateway(
        store,
        router,
        GATEWAY_KEY,
        transport=ByHostTransport(engines),
        tenants=TenantKeyCache(store.tenant_keys, cache_s=0),
        tenant_header=True,
        privacy=PrivacyConfig(mode="off"),
    )
    key_a = store.tenant_keys.issue("acme")
    store.tenant_keys.issue("bolt")
    ro_b = store.enqueue_rollout(Rollout(tenant="bolt")).rollout_id
    claimed = store.claim_rollout("w-bolt")  # bolt's rollout runs: its attempt is an id acme may send too
    assert claimed is not None and claimed[0].rollout_id == ro_b
    ro_a = store.enqueue_rollout(Rollout(tenant="acme")).rollout_id
    yield store, app, engines, key_a, ro_a, (ro_b, claimed[1].attempt_id)
    store.close()


_model = st.one_of(
    st.sampled_from(
        ["policy", "policy@bolt", "policy@bolt/v1", "policy@acme", "policy@acme/v1", "policy@v1", "bolt", ""]
    ),
    json_values(max_leaves=4, max_text=20),
)
_text = st.one_of(st.text(max_size=30), json_values(max_leaves=6, max_text=20))
_chat = st.fixed_dictionaries(
    {"model": _model},
    optional={
        "messages": st.one_of(
            st.lists(
                st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": _text}),
                max_size=2,
            ),
            json_values(max_leaves=6),
        ),
        "stream": st.one_of(st.booleans(), json_values(max_leaves=2)),
        "max_tokens": st.one_of(st.integers(-2, 20), json_values(max_leaves=2)),
        "user": _text,
        "metadata": json_values(max_leaves=6),
    },
)
_responses = st.fixed_dictionaries(
    {"model": _model},
    optional={"input": _text, "stream": st.booleans(), "previous_response_id": _text, "instructions": _text},
)
_messages = st.fixed_dictionaries(
    {"model": _model},
    optional={
        "messages": st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": _text}), max_size=2),
        "max_tokens": st.integers(-2, 20),
        "stream": st.booleans(),
        "system": _text,
    },
)
_calls = st.one_of(
    st.tuples(st.sampled_from(["/v1/chat/completions", "/v1/completions"]), _chat),
    st.tuples(st.just("/v1/responses"), _responses),
    st.tuples(st.just("/v1/messages"), _messages),
)


def _post(app, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.post(path, content=body, headers=headers)

    return asyncio.run(call())


@_SETTINGS
@given(
    call=_calls,
    prefix=st.sampled_from(["none", "own", "bolt's", "unknown"]),
    rollout_header=st.sampled_from(["none", "own", "bolt's"]),
    attempt_header=st.booleans(),
    tenant_header=st.sampled_from([None, "bolt", "acme", "", "BOLT"]),
    raw=st.one_of(st.none(), st.binary(max_size=60)),
)
def test_a_tenant_never_reaches_another_tenants_engine_rollout_or_answers(
    world,
    call: tuple[str, dict],
    prefix: str,
    rollout_header: str,
    attempt_header: bool,
    tenant_header: str | None,
    raw: bytes | None,
) -> None:
    store, app, engines, key_a, ro_a, (ro_b, attempt_b) = world
    route, body = call
    ids = {"none": None, "own": ro_a, "bolt's": ro_b, "unknown": "ro-not-there"}
    path = f"/rollouts/{ids[prefix]}{route}" if ids[prefix] else route
    headers = {"Authorization": f"Bearer {key_a}", "content-type": "application/json", "x-api-key": key_a}
    if ids[rollout_header]:
        headers["X-Rollout-Id"] = ids[rollout_header]  # type: ignore[assignment]
    if attempt_header:
        headers["X-Attempt-Id"] = attempt_b
    if tenant_header is not None:
        headers["X-Tenant"] = tenant_header
    bolt_served = engines["bolt"].served
    bolt_spans = len(store.list_spans(rollout_id=ro_b))
    response = _post(app, path, raw if raw is not None else json.dumps(body).encode(), headers)
    assert response.status_code != 500 or "error" in response.text, response.text[:300]
    assert engines["bolt"].served == bolt_served, (path, body, headers)
    sent = path + json.dumps(body) + json.dumps(headers) + repr(raw)
    for secret in (
        BOLT_TEXT,
        "policy@bolt/v1",
        ro_b,
    ):  # an error may echo what acme itself sent, nothing more
        assert secret in sent or secret not in response.text, (secret, response.text[:300])
    assert len(store.list_spans(rollout_id=ro_b)) == bolt_spans
    assert not [s for s in store.list_spans(orphans=True) if s.tenant == "bolt"]
