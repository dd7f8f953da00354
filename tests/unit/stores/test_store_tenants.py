"""Tenant keys on the HTTP store API (real uvicorn server, real SQLite file): a tenant key sees and writes only
its tenant's rollouts, spans, rewards and lineages; it cannot pin another tenant's version nor act as a worker or
an admin; keys are stored hashed, and rotation and revocation take effect without a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures_store import serve_app
from sqlmodel import select

from agentforge.errors import NotFoundError, UserError
from agentforge.stores.http import HTTPStore
from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore
from agentforge.stores.tenants import TenantKeyCache, TenantKeyRow
from agentforge.types import ResourceVersion, Reward, Rollout, Span

STORE_KEY, ADMIN_KEY = "tenants-test-store-key", "tenants-test-admin-key"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[SQLStore, str]]:
    """A store app with tenant keys on real uvicorn, over SQLite and PostgreSQL (``pg_url`` skips without
    ``AGENTFORGE_TEST_PG_URL``)."""
    url = (
        f"sqlite:///{tmp_path / 'traces.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    with SQLStore(url) as store:
        app = create_store_app(
            store,
            api_key=STORE_KEY,
            admin_key=ADMIN_KEY,
            tenants=TenantKeyCache(store.tenant_keys, cache_s=0),
        )
        with serve_app(app) as url:
            yield store, url


def _as(url: str, key: str) -> HTTPStore:
    return HTTPStore(url, api_key=key)


def test_a_tenant_key_sees_and_writes_only_its_own_tenant(served: tuple[SQLStore, str]) -> None:
    store, url = served
    key_a, key_b = store.tenant_keys.issue("acme"), store.tenant_keys.issue("bolt")
    store.publish_resource(ResourceVersion(name="policy@bolt", kind="other", payload={"x": 1}))
    store.publish_resource(ResourceVersion(name="policy", kind="other", payload={"x": 0}))
    with _as(url, key_a) as a, _as(url, key_b) as b:
        ra = a.enqueue_rollout(Rollout(rollout_id="ro-a"))
        rb = b.enqueue_rollout(Rollout(rollout_id="ro-b", resources={"policy": "policy@bolt/v1"}))
        assert (ra.tenant, rb.tenant) == ("acme", "bolt")  # stamped from the key, not from the body
        assert [r.rollout_id for r in a.list_rollouts()] == ["ro-a"]
        with pytest.raises(UserError, match="cannot list"):
            a.list_rollouts(tenant="bolt")
        for read in (a.get_rollout, a.list_rewards, a.final_reward, a.list_attempts):
            with pytest.raises(NotFoundError):  # exactly like an id that does not exist
                read("ro-b")
        with pytest.raises(NotFoundError):
            a.list_spans(rollout_id="ro-b")
        b.add_span(Span(span_id="sp-b", rollout_id="ro-b"))
        assert a.list_spans() == [] and [s.span_id for s in b.list_spans()] == ["sp-b"]
        with pytest.raises(NotFoundError):
            a.add_reward(Reward(rollout_id="ro-b", value=1.0))
        with pytest.raises(NotFoundError):
            a.update_rollout("ro-b", metadata={"x": 1})
        with pytest.raises(UserError, match="cannot write a rollout of tenant 'bolt'"):
            a.enqueue_rollout(Rollout(tenant="bolt"))
        with pytest.raises(UserError, match="another tenant's version"):  # cannot pin B's version
            a.enqueue_rollout(Rollout(resources={"policy": "policy@bolt/v1"}))
        with pytest.raises(UserError, match="another tenant's version"):
            a.update_rollout("ro-a", resources={"policy": "policy@bolt/v1"})
        assert a.add_reward(Reward(rollout_id="ro-a", value=0.5)).tenant == "acme"
        store.publish_resource(
            ResourceVersion(name="privacy:deletions", kind="other", payload={"subject": "x"})
        )
        assert [r.name for r in a.list_resources()] == [
            "policy"
        ]  # bolt's lineage, the store's logs: not listed
        with pytest.raises(NotFoundError):
            a.get_resource("privacy:deletions")
        with pytest.raises(NotFoundError):
            a.get_resource("policy@bolt")
        with pytest.raises(UserError):  # workers hold the store key
            a.claim_rollout("w-1")
        assert (
            httpx.get(f"{url}/api/rollouts/page", headers={"X-Api-Key": key_a}, timeout=10).status_code == 403
        )
        with pytest.raises(UserError):  # publishing needs the admin key (a tenant key is not one)
            HTTPStore(url, api_key=key_a, admin_key=key_a).publish_resource(
                ResourceVersion(name="policy@acme", kind="other")
            )
    with _as(url, STORE_KEY) as whole:  # the store key still sees every tenant
        assert [r.rollout_id for r in whole.list_rollouts()] == ["ro-a", "ro-b"]
        assert [r.rollout_id for r in whole.list_rollouts(tenant="bolt")] == ["ro-b"]


def test_an_idempotent_write_never_answers_with_another_tenants_record(served: tuple[SQLStore, str]) -> None:
    """Issue 36, High 1: a tenant that names another tenant's rollout, span or reward id (guessed, leaked or
    predicted) in a write gets a 409 that carries nothing of the stored record, on every write route."""
    store, url = served
    key_a, key_b = store.tenant_keys.issue("acme"), store.tenant_keys.issue("bolt")
    secret = "bolt-customer-4111-secret"
    with _as(url, key_b) as b:
        rb = b.enqueue_rollout(Rollout(input={"message": secret}))
        sb = b.add_span(Span(rollout_id=rb.rollout_id, attributes={"prompt": secret}))
        wb = b.add_reward(Reward(rollout_id=rb.rollout_id, value=1.0, metadata={"note": secret}))
    orphan = store.add_span(Span(attributes={"prompt": secret}))  # written with the store key: no tenant
    headers = {"X-Api-Key": key_a}
    with _as(url, key_a) as a:
        ra = a.enqueue_rollout(Rollout())
        posts = [
            ("/api/rollouts", {"rollout_id": rb.rollout_id}),
            ("/api/spans", {"span_id": sb.span_id, "rollout_id": ra.rollout_id}),
            ("/api/spans", {"span_id": orphan.span_id}),
            ("/api/rewards", {"reward_id": wb.reward_id, "rollout_id": ra.rollout_id, "value": 0.0}),
        ]
        for path, body in posts:
            r = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=10)
            assert r.status_code == 409, (path, r.status_code, r.text)
            assert secret not in r.text and "bolt" not in r.text, r.text  # not the record, not its tenant
        batch = {
            "items": [
                {"span": {"span_id": sb.span_id, "rollout_id": ra.rollout_id}},
                {"reward": {"reward_id": wb.reward_id, "rollout_id": ra.rollout_id, "value": 0.0}},
                {"span": {"rollout_id": ra.rollout_id}},
            ],
            "ack": "full",
        }
        r = httpx.post(f"{url}/api/batch", json=batch, headers=headers, timeout=10)
        assert r.status_code == 200 and secret not in r.text and "bolt" not in r.text, r.text
        results = r.json()["results"]
        assert [x["error"] for x in results] == ["IdInUseError", "IdInUseError", None], results
    # nothing of bolt's changed, and acme's own idempotent write still answers with its record
    assert store.get_rollout(rb.rollout_id).tenant == "bolt"
    assert store.list_spans(rb.rollout_id)[0].attributes == {"prompt": secret}
    with _as(url, key_a) as a:
        assert a.enqueue_rollout(Rollout(rollout_id=ra.rollout_id)).rollout_id == ra.rollout_id


def _status(url: str, key: str) -> int:
    return httpx.get(
        f"{url}/api/rollouts", headers={"Authorization": f"Bearer {key}"}, timeout=10
    ).status_code


def test_rotation_and_revocation_take_effect_without_a_restart(served: tuple[SQLStore, str]) -> None:
    store, url = served
    old = store.tenant_keys.issue("acme")
    assert _status(url, old) == 200
    (listed,) = store.tenant_keys.list("acme")
    new = store.tenant_keys.rotate(listed.key_id, grace_s=0)
    assert _status(url, old) == 401 and _status(url, new) == 200
    new_id = next(k.key_id for k in store.tenant_keys.list("acme") if k.active())
    store.tenant_keys.revoke(new_id)
    assert _status(url, new) == 401
    assert _status(url, new[:-1] + ("A" if new[-1] != "A" else "B")) == 401  # a forged secret
    stored: Any = store._tx.run(lambda s: [r.digest for r in s.exec(select(TenantKeyRow))], write=False)
    assert all(new.split("_", 2)[2] not in d and len(d) == 64 for d in stored)  # only SHA-256 digests


def test_a_key_revoked_elsewhere_is_refused_after_the_cache_interval(tmp_path: Path) -> None:
    with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as store:
        key = store.tenant_keys.issue("acme")
        clock = [0.0]
        cache = TenantKeyCache(store.tenant_keys, cache_s=5.0)
        cache_clock = pytest.MonkeyPatch()
        cache_clock.setattr("agentforge.stores.tenants.time.monotonic", lambda: clock[0])
        try:
            assert cache.peek(key) is None  # not asked yet: the caller asks the store (in a thread)
            assert cache.tenant_of_key(key) == "acme" and cache.peek(key) == ("acme",)
            store.tenant_keys.revoke(store.tenant_keys.list()[0].key_id)
            clock[0] = 4.0
            assert cache.tenant_of_key(key) == "acme"  # within the interval: the remembered answer
            clock[0] = 5.5
            assert cache.tenant_of_key(key) is None
        finally:
            cache_clock.undo()
        with pytest.raises(UserError, match="tenant name"):
            store.tenant_keys.issue("Acme Corp")
        with pytest.raises(NotFoundError):
            store.tenant_keys.revoke("0123456789abcdef")
