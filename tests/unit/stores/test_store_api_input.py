"""The store API's answers to wrongly typed or hostile input (issue 16, low items on the store API): a JSON
4xx with the store's error body, never a plain-text 500; infinite rewards refused; the key in the header
forms the gateway takes; ids that cannot travel in a URL refused up front.

Real components: ``create_store_app`` under uvicorn on a SQLite file, called with httpx.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fixtures_store import serve_app

from agentforge.errors import UserError
from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore
from agentforge.types import Rollout, RolloutState

KEY = "store-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[str, SQLStore]]:
    with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as store:
        with serve_app(create_store_app(store, api_key=KEY)) as url:
            yield url, store


def _detail(resp: httpx.Response) -> dict:
    assert resp.headers["content-type"].startswith("application/json"), resp.text
    return resp.json()["detail"]


def test_patch_with_wrong_types_is_a_json_400_and_changes_nothing(api) -> None:
    url, store = api
    ro = store.enqueue_rollout(Rollout(metadata={"keep": True}))
    target = f"{url}/api/rollouts/{ro.rollout_id}"
    for body, field in (
        ({"state": 5}, "state"),
        ({"state": "exploded"}, "state"),
        ({"metadata": "not an object"}, "metadata"),
        ({"metadata": [1, 2]}, "metadata"),
        ({"resources": [1]}, "resources"),
        ({"resources": {"policy": 3}}, "resources.policy"),
        ({"error": {"x": 1}}, "error"),
    ):
        resp = httpx.patch(target, json=body, headers=AUTH)
        assert resp.status_code == 400, (body, resp.text)
        detail = _detail(resp)
        assert detail["error"] == "UserError" and f"update_rollout: {field}:" in detail["message"], detail
    not_an_object = httpx.patch(target, json=[1, 2], headers=AUTH)
    assert not_an_object.status_code == 422 and isinstance(_detail(not_an_object), list)
    assert store.get_rollout(ro.rollout_id) == ro
    ok = httpx.patch(target, json={"state": "cancelled", "metadata": {"k": [1]}}, headers=AUTH)
    assert ok.status_code == 200 and ok.json()["state"] == RolloutState.cancelled.value


def test_infinite_rewards_are_refused_and_nan_is_stored_invalid(api) -> None:
    url, store = api
    ro = store.enqueue_rollout(Rollout())
    headers = {**AUTH, "Content-Type": "application/json"}
    for raw in ("Infinity", "-Infinity", "1e999"):
        body = f'{{"rollout_id": "{ro.rollout_id}", "value": {raw}}}'
        resp = httpx.post(f"{url}/api/rewards", content=body, headers=headers)
        assert resp.status_code == 400 and "finite" in _detail(resp)["message"], (raw, resp.text)
    batch = f'{{"items": [{{"reward": {{"rollout_id": "{ro.rollout_id}", "value": Infinity}}}}]}}'
    resp = httpx.post(f"{url}/api/batch", content=batch, headers=headers)
    assert resp.status_code == 200 and "finite" in resp.json()["results"][0]["message"]
    assert store.list_rewards(ro.rollout_id) == []
    nan = httpx.post(
        f"{url}/api/rewards", content=f'{{"rollout_id": "{ro.rollout_id}", "value": NaN}}', headers=headers
    )
    assert nan.status_code == 200 and nan.json()["value"] is None  # kept, marked invalid, never a number
    assert [r.valid for r in store.list_rewards(ro.rollout_id)] == [False]


def test_store_routes_take_the_key_like_the_gateway(api) -> None:
    url, _ = api
    for headers in (
        {"X-Api-Key": KEY},
        {"Authorization": f"bearer {KEY}"},
        {"Authorization": f"BEARER  {KEY}"},
    ):
        assert httpx.get(f"{url}/api/rollouts", headers=headers).status_code == 200, headers
    for headers in (
        {},
        {"Authorization": KEY},
        {"Authorization": f"Basic {KEY}"},
        {"X-Api-Key": "wrong-key-0123456789"},
    ):
        resp = httpx.get(f"{url}/api/rollouts", headers=headers)
        assert resp.status_code == 401 and _detail(resp)["error"] == "UserError", headers


def test_ids_that_cannot_travel_in_a_url_are_refused_up_front(api) -> None:
    url, store = api
    for rollout_id in ("a/b", "x" * 201, "white space"):
        resp = httpx.post(f"{url}/api/rollouts", json={"rollout_id": rollout_id}, headers=AUTH)
        assert resp.status_code == 400 and "not a valid id" in _detail(resp)["message"]
    assert store.list_rollouts() == []
    ok = httpx.post(f"{url}/api/rollouts", json={"rollout_id": "session:42@app"}, headers=AUTH)
    assert ok.status_code == 200
    assert (
        httpx.get(f"{url}/api/rollouts/session:42@app", headers=AUTH).json()["rollout_id"] == "session:42@app"
    )


def test_one_schema_invalid_item_fails_alone_not_its_batch(api) -> None:
    """Issue 36, Low: one item that does not fit the schema dropped a whole batch of 100 with a 422. Now it
    fails alone (``ValidationError``, with where and why) and the 99 others are written."""
    url, store = api
    ro = store.enqueue_rollout(Rollout())
    items: list[dict] = [{"span": {"rollout_id": ro.rollout_id, "name": f"s{i}"}} for i in range(99)]
    items.insert(40, {"span": {"rollout_id": ro.rollout_id, "kind": "not-a-kind"}})
    items.append(
        {"span": {"rollout_id": ro.rollout_id}, "reward": {"rollout_id": ro.rollout_id, "value": 1.0}}
    )
    resp = httpx.post(f"{url}/api/batch", json={"items": items, "ack": "patch"}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    errors = {i: r["message"] for i, r in enumerate(resp.json()["results"]) if r["error"]}
    assert sorted(errors) == [40, 100] and "span.kind" in errors[40] and "exactly one" in errors[100]
    assert len(store.list_spans(rollout_id=ro.rollout_id)) == 99
    bad_envelope = httpx.post(f"{url}/api/batch", json={"items": "nope"}, headers=AUTH)
    assert bad_envelope.status_code == 422  # the request itself is wrong: nothing to salvage


def test_a_body_over_the_limit_is_a_413_and_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    """Issue 36 (low): a 30 MB span was accepted. Over the limit, with Content-Length or chunked, the answer
    is a 413 in the store's error shape before any route runs; HTTPStore splits a large batch below the limit
    and an item too big on its own fails alone, the others written."""
    from agentforge.stores.http import HTTPStore
    from agentforge.types import Reward, Span, SpanKind

    limit = 64 * 1024
    with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as store:
        with serve_app(create_store_app(store, api_key=KEY, max_request_bytes=limit)) as url:
            ro = store.enqueue_rollout(Rollout())
            huge = Span(
                rollout_id=ro.rollout_id, kind=SpanKind.custom, name="big", attributes={"x": "a" * limit}
            )
            raw = huge.model_dump_json().encode()
            headers = {**AUTH, "Content-Type": "application/json"}
            resp = httpx.post(f"{url}/api/spans", content=raw, headers=headers)
            assert resp.status_code == 413, resp.text
            assert _detail(resp)["error"] == "UserError" and str(limit) in _detail(resp)["message"]

            def chunks() -> Iterator[bytes]:  # no Content-Length: refused while reading
                for start in range(0, len(raw), 4096):
                    yield raw[start : start + 4096]

            resp = httpx.post(f"{url}/api/spans", content=chunks(), headers=headers)
            assert resp.status_code == 413, resp.text
            assert store.list_spans(ro.rollout_id) == []
            small = Span(
                rollout_id=ro.rollout_id, kind=SpanKind.custom, name="ok", attributes={"x": "b" * 100}
            )
            assert (
                httpx.post(f"{url}/api/spans", content=small.model_dump_json(), headers=headers).status_code
                == 200
            )

            monkeypatch.setattr("agentforge.stores.http.MAX_BODY_BYTES", limit)  # the client's view of it
            monkeypatch.setattr("agentforge.stores.http.BATCH_BYTES", limit // 2)
            client = HTTPStore(url, api_key=KEY)
            try:  # many items whose sum is over the limit: split into requests under it, all written
                many = [
                    Span(
                        rollout_id=ro.rollout_id,
                        kind=SpanKind.custom,
                        name=f"s{i}",
                        attributes={"x": "c" * 2000},
                    )
                    for i in range(60)
                ]
                out = client.write_batch(
                    [*many[:30], huge, *many[30:], Reward(rollout_id=ro.rollout_id, value=1.0)]
                )
            finally:
                client.close()
            assert isinstance(out[30], UserError) and "limit" in str(out[30])
            assert [type(o).__name__ for o in out[:30] + out[31:]] == ["Span"] * 60 + ["Reward"]
            assert sorted(s.name for s in store.list_spans(ro.rollout_id)) == sorted(
                ["ok", *(s.name for s in many)]
            )
            assert [r.value for r in store.list_rewards(ro.rollout_id)] == [1.0]


def test_agent_names_and_task_ids_are_validated(api) -> None:
    """Issue 36 (low): agent names and task ids were taken as any string (control characters that forge a log
    or table line, megabytes of name). Now: a 422 naming the field, nothing stored; ordinary ones (with '/')
    pass."""
    url, store = api
    for body, field in (
        ({"agent": "bot\nINFO forged line"}, "agent"),
        ({"agent": "a" * 201}, "agent"),
        ({"task": {"task_id": ""}}, "task_id"),
        ({"task": {"task_id": "t\x00"}}, "task_id"),
        ({"task": {"task_id": "t" * 501}}, "task_id"),
    ):
        resp = httpx.post(f"{url}/api/rollouts", json=body, headers=AUTH)
        assert resp.status_code == 422 and field in resp.text, (body, resp.text)
    assert store.list_rollouts() == []
    ok = httpx.post(
        f"{url}/api/rollouts", json={"agent": "order-bot", "task": {"task_id": "bitext/12"}}, headers=AUTH
    )
    assert ok.status_code == 200 and [r.task.task_id for r in store.list_rollouts()] == ["bitext/12"]
