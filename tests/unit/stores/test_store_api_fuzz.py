"""Property-based fuzzing of the store's HTTP API with Hypothesis (issue 16, must-show).

Any method on any store route, with ids, query strings and JSON bodies of any shape, gets a JSON answer and
never a 500: a bad request is a 4xx saying what is wrong. A well-formed span or reward sent with it is
stored exactly once (nothing the API acknowledged goes missing).
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import quote

import httpx
import pytest
from fuzzing import FUZZ, json_values
from hypothesis import given, settings
from hypothesis import strategies as st

from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore
from agentforge.types import Rollout, RolloutState

_SETTINGS = settings(FUZZ, max_examples=200)
KEY, ADMIN = "store-key-0123456789", "store-admin-0123456789"

_json = json_values(max_leaves=16, max_text=30)
_ids = st.one_of(
    st.sampled_from(
        ["ro-known", "at-known", "nope", "", "a" * 300, "..", "%2F", "ro known", "🤖", "\u0000x"]
    ),
    st.text(max_size=20),
)
_templates = [
    "/api/rollouts",
    "/api/rollouts/claim",
    "/api/rollouts/requeue_stale",
    "/api/rollouts/{id}",
    "/api/rollouts/{id}/attempts",
    "/api/attempts/{id}/heartbeat",
    "/api/attempts/{id}/finish",
    "/api/spans",
    "/api/batch",
    "/api/rewards",
    "/api/rollouts/{id}/rewards",
    "/api/rollouts/{id}/final_reward",
    "/api/resources",
    "/api/resources/version",
    "/api/resources/activate",
    "/api/store/health",
]
_span_fields = st.fixed_dictionaries(
    {},
    optional={
        "span_id": _ids,
        "rollout_id": _ids,
        "attempt_id": _ids,
        "kind": st.sampled_from(["llm", "tool", "x"]),
        "name": _json,
        "status": _json,
        "attributes": _json,
        "llm": _json,
        "started_at": _json,
    },
)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """One store server app (in-process) for every example, with a running rollout ``ro-known``."""
    store = SQLStore(f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'traces.db'}")
    store.enqueue_rollout(Rollout(rollout_id="ro-known"))
    store.update_rollout("ro-known", state=RolloutState.running)
    app = create_store_app(store, api_key=KEY, admin_key=ADMIN)
    yield store, app
    store.close()


def _send(app, method: str, path: str, **kwargs) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://store") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(call())


def _check(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code != 204:
        response.json()  # always JSON, errors included


@_SETTINGS
@given(
    template=st.sampled_from(_templates),
    rid=_ids,
    method=st.sampled_from(["GET", "POST", "PATCH", "PUT", "DELETE"]),
    params=st.dictionaries(
        st.sampled_from(
            [
                "rollout_id",
                "state",
                "agent",
                "kind",
                "name",
                "version",
                "limit",
                "orphans",
                "valid_only",
                "worker_id",
            ]
        ),
        st.text(max_size=12),
        max_size=3,
    ),
    body=_json,
    key=st.sampled_from([KEY, ADMIN, "", "wrong-key-0123456789"]),
)
def test_any_request_to_the_store_api_gets_a_json_answer_and_never_a_500(
    api, template: str, rid: str, method: str, params: dict, body: object, key: str
) -> None:
    _, app = api
    path = template.replace("{id}", quote(rid, safe=""))
    response = _send(
        app, method, path, params=params, content=json.dumps(body), headers={"authorization": f"Bearer {key}"}
    )
    _check(response)


@_SETTINGS
@given(fields=_span_fields, as_batch=st.booleans())
def test_a_span_the_api_acknowledges_is_stored_exactly_once(api, fields: dict, as_batch: bool) -> None:
    store, app = api
    headers = {"authorization": f"Bearer {KEY}"}
    if as_batch:
        response = _send(app, "POST", "/api/batch", json={"items": [{"span": fields}]}, headers=headers)
    else:
        response = _send(app, "POST", "/api/spans", json=fields, headers=headers)
    _check(response)
    if response.status_code != 200:
        return
    data = response.json()
    span = data["results"][0].get("span") if as_batch else data
    if span is None:  # the one item failed alone, with its error
        assert data["results"][0]["error"]
        return
    stored = [
        s
        for s in store.list_spans(rollout_id=span["rollout_id"], orphans=span["rollout_id"] is None)
        if s.span_id == span["span_id"]
    ]
    assert len(stored) == 1 and stored[0].sequence == span["sequence"]
