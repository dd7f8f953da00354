"""Bounded listings (issue 36, Low: "listings are unbounded"): ``GET /api/spans`` beyond one rollout answers at
most ``SPAN_PAGE`` spans, the next page's start in the ``X-Next-After-Sequence`` header; ``GET /api/rollouts``
at most ``ROLLOUT_PAGE`` rollouts, the next page's ``after`` in ``X-Next-After-Rollout``. ``HTTPStore`` reads
every page, so the Python API still lists everything; one rollout's spans are paged the same way; a tenant's
pages hold only its rollouts, and another tenant's rollout id is no cursor. One rollout's rewards (anyone with
its URL may post any number) and ``GET /api/resources`` are paged too; a tenant's resource pages hold only what
it may see, however few of a page that is."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fixtures_store import serve_app

from agentforge.errors import NotFoundError
from agentforge.stores import server as store_server
from agentforge.stores.http import HTTPStore
from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore
from agentforge.stores.tenants import TenantKeyCache
from agentforge.stores.wire import NEXT_AFTER_RESOURCE, NEXT_AFTER_ROLLOUT, NEXT_AFTER_SEQUENCE
from agentforge.types import AttemptState, ResourceVersion, Reward, Rollout, RolloutState, Span, SpanKind

KEY = "span-pages-store-key-0123"
PAGE = 7


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(store_server, "SPAN_PAGE", PAGE)
    monkeypatch.setattr(store_server, "ROLLOUT_PAGE", PAGE)
    monkeypatch.setattr(store_server, "REWARD_PAGE", PAGE)
    monkeypatch.setattr(store_server, "RESOURCE_PAGE", PAGE)
    with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as store:
        app = create_store_app(store, api_key=KEY, tenants=TenantKeyCache(store.tenant_keys, cache_s=0))
        with serve_app(app) as url:
            yield store, url


def _fill(store: SQLStore) -> tuple[Rollout, list[Span]]:
    """17 orphan spans and one rollout whose first attempt (3 spans) failed and whose second (2) succeeded."""
    for i in range(17):
        store.add_span(Span(kind=SpanKind.custom, name=f"orphan-{i}"))
    rollout = store.enqueue_rollout(Rollout(max_attempts=2))
    for spans in (3, 2):
        _, attempt = store.claim_rollout("w")  # type: ignore[misc]
        for i in range(spans):
            store.add_span(Span(rollout_id=rollout.rollout_id, kind=SpanKind.custom, name=f"s{i}"))
        store.finish_attempt(
            attempt.attempt_id, AttemptState.failed if spans == 3 else AttemptState.succeeded
        )
    return rollout, store.list_spans()


def test_a_listing_beyond_one_rollout_is_paged_and_the_client_reads_every_page(served) -> None:  # type: ignore[no-untyped-def]
    store, url = served
    rollout, everything = _fill(store)
    assert len(everything) == 22
    headers = {"Authorization": f"Bearer {KEY}"}
    first = httpx.get(f"{url}/api/spans", headers=headers)
    assert first.status_code == 200 and len(first.json()) == PAGE
    cursor = int(first.headers[NEXT_AFTER_SEQUENCE])
    assert cursor == everything[PAGE - 1].sequence
    asked = httpx.get(f"{url}/api/spans", params={"limit": 10**6}, headers=headers)
    assert len(asked.json()) == PAGE  # a larger limit does not lift the cap
    last = httpx.get(f"{url}/api/spans", params={"after_sequence": everything[-3].sequence}, headers=headers)
    assert len(last.json()) == 2 and NEXT_AFTER_SEQUENCE not in last.headers
    own = httpx.get(f"{url}/api/spans", params={"rollout_id": rollout.rollout_id}, headers=headers)
    assert len(own.json()) == 5 and NEXT_AFTER_SEQUENCE not in own.headers  # one page
    chatty = store.enqueue_rollout(Rollout())
    for i in range(PAGE + 2):  # one rollout's agent may write any number of spans: paged too
        store.add_span(Span(rollout_id=chatty.rollout_id, kind=SpanKind.custom, name=f"c{i}"))
    page = httpx.get(f"{url}/api/spans", params={"rollout_id": chatty.rollout_id}, headers=headers)
    assert len(page.json()) == PAGE and NEXT_AFTER_SEQUENCE in page.headers
    assert httpx.get(f"{url}/api/spans", params={"limit": 0}, headers=headers).status_code == 422

    client = HTTPStore(url, api_key=KEY)
    try:
        assert [s.span_id for s in client.list_spans()] == [s.span_id for s in store.list_spans()]  # 5 pages
        assert [s.name for s in client.list_spans(chatty.rollout_id)] == [f"c{i}" for i in range(PAGE + 2)]
        valid = client.list_spans(valid_only=True)
        assert [s.span_id for s in valid] == [s.span_id for s in store.list_spans(valid_only=True)]
        # the failed attempt's 3 spans are left out, across the page boundary
        assert len(valid) == 19 + PAGE + 2
        assert [s.name for s in client.list_spans(orphans=True, limit=3)] == [
            "orphan-0",
            "orphan-1",
            "orphan-2",
        ]
        tail = client.list_spans(after_sequence=everything[10].sequence, limit=9)
        assert [s.span_id for s in tail] == [s.span_id for s in everything[11:20]]  # two pages, cut at 9
    finally:
        client.close()


def test_rollout_listings_are_paged_per_tenant_and_the_client_reads_every_page(served) -> None:  # type: ignore[no-untyped-def]
    store, url = served
    ids = {"acme": [], "bolt": []}
    for i in range(23):  # interleaved: acme 12, bolt 11
        tenant = "acme" if i % 2 == 0 else "bolt"
        ids[tenant].append(store.enqueue_rollout(Rollout(tenant=tenant, agent=f"a{i % 3}")).rollout_id)
    everything = ids["acme"] + ids["bolt"]
    headers = {"Authorization": f"Bearer {KEY}"}
    first = httpx.get(f"{url}/api/rollouts", params={"limit": 10**6}, headers=headers)
    assert first.status_code == 200 and len(first.json()) == PAGE  # a larger limit does not lift the cap
    assert first.headers[NEXT_AFTER_ROLLOUT] == first.json()[-1]["rollout_id"]
    unknown = httpx.get(f"{url}/api/rollouts", params={"after": "ro-nope"}, headers=headers)
    assert unknown.status_code == 404 and "ro-nope" in unknown.json()["detail"]["message"]
    assert httpx.get(f"{url}/api/rollouts", params={"limit": 0}, headers=headers).status_code == 422

    client = HTTPStore(url, api_key=KEY)
    try:
        listed = [r.rollout_id for r in client.list_rollouts()]  # 4 pages
        assert sorted(listed) == sorted(everything) and listed == [
            r.rollout_id for r in store.list_rollouts()
        ]
        assert [r.rollout_id for r in client.list_rollouts(tenant="bolt")] == ids["bolt"]  # 2 pages
        assert [r.rollout_id for r in client.list_rollouts(agent="a1")] == [
            r.rollout_id for r in store.list_rollouts(agent="a1")
        ]
        tail = client.list_rollouts(after=listed[4], limit=9)  # across a page boundary, cut at 9
        assert [r.rollout_id for r in tail] == listed[5:14]
        assert client.list_rollouts(state=RolloutState.running) == []
    finally:
        client.close()
    tenant_client = HTTPStore(url, api_key=store.tenant_keys.issue("acme"))
    try:
        assert [r.rollout_id for r in tenant_client.list_rollouts()] == ids["acme"]  # 2 pages, acme's only
        with pytest.raises(
            NotFoundError
        ):  # bolt's id is no cursor for acme: the same answer as an unknown id
            tenant_client.list_rollouts(after=ids["bolt"][0])
    finally:
        tenant_client.close()


def test_reward_and_resource_listings_are_paged_and_the_client_reads_every_page(served) -> None:  # type: ignore[no-untyped-def]
    store, url = served
    rollout = store.enqueue_rollout(Rollout(tenant="acme"))
    for i in range(2 * PAGE + 3):
        store.add_reward(Reward(rollout_id=rollout.rollout_id, name=f"r{i}", value=float(i)))
    names = ["prompt:shared", "prompt@acme", "prompt@bolt"]
    for name in names:
        for v in range(5):
            store.publish_resource(ResourceVersion(name=name, kind="prompt", payload={"v": v}))
    headers = {"Authorization": f"Bearer {KEY}"}
    path = f"{url}/api/rollouts/{rollout.rollout_id}/rewards"
    first = httpx.get(path, params={"limit": 10**6}, headers=headers)
    assert first.status_code == 200 and len(first.json()) == PAGE  # a larger limit does not lift the cap
    assert int(first.headers[NEXT_AFTER_SEQUENCE]) == first.json()[-1]["sequence"]
    resources = httpx.get(f"{url}/api/resources", headers=headers)
    assert len(resources.json()) == PAGE and NEXT_AFTER_RESOURCE in resources.headers
    for bad in ("nope", "[1, 2]", '["a"]', '["a", 1.5]'):
        answer = httpx.get(f"{url}/api/resources", params={"after": bad}, headers=headers)
        assert answer.status_code == 400 and "name, version" in answer.json()["detail"]["message"]

    client = HTTPStore(url, api_key=KEY)
    try:
        assert [r.name for r in client.list_rewards(rollout.rollout_id)] == [
            f"r{i}" for i in range(2 * PAGE + 3)
        ]
        tail = client.list_rewards(
            rollout.rollout_id, after_sequence=first.json()[2]["sequence"], limit=PAGE + 1
        )
        assert [r.name for r in tail] == [f"r{i}" for i in range(3, PAGE + 4)]  # across a page boundary
        listed = [(r.name, r.version) for r in client.list_resources()]  # 3 pages
        assert listed == [(r.name, r.version) for r in store.list_resources()] and len(listed) == 15
        assert [r.version for r in client.list_resources(names[1], after=(names[1], 2))] == [3, 4, 5]
    finally:
        client.close()
    tenant_client = HTTPStore(url, api_key=store.tenant_keys.issue("bolt"))
    try:  # bolt sees the shared prompt and its own lineage; acme's 5 versions fill most of the second page
        seen = [(r.name, r.version) for r in tenant_client.list_resources()]
        assert seen == [(n, v) for n in (names[0], names[2]) for v in range(1, 6)]
        with pytest.raises(NotFoundError):
            tenant_client.list_rewards(rollout.rollout_id)  # acme's rollout
    finally:
        tenant_client.close()
