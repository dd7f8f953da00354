"""Admin authority is separate from store access (issue 16, medium 6 and "admin authority separate from
inference"): publishing and activating resources over the store API need the admin key, adapter paths must
resolve inside the adapter root, and every admin call is logged with its caller and outcome.

Real components: ``create_store_app`` under uvicorn on a SQLite store, called with httpx and ``HTTPStore``.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures_store import serve_app

from agentforge.errors import UserError
from agentforge.stores.http import HTTPStore
from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore
from agentforge.trainers.publish import StorePublisher, rollback_adapter
from agentforge.types import ResourceVersion

STORE_KEY = "store-key-0123456789"
ADMIN_KEY = "admin-key-9876543210"


def _adapter(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(
        '{"peft_type": "LORA", "r": 8, "base_model_name_or_path": "b"}'
    )
    return folder


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, SQLStore, Path]]:
    """``(url, backing store, adapter root)`` of a keyed store server."""
    root = tmp_path / "adapters"
    root.mkdir()
    with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as backing:
        app = create_store_app(backing, api_key=STORE_KEY, admin_key=ADMIN_KEY, adapter_root=root)
        with serve_app(app) as url:
            yield url, backing, root


def _publish(url: str, payload: dict[str, Any], **headers: str) -> httpx.Response:
    body = {"name": "policy", "kind": "adapter", "payload": payload}
    return httpx.post(f"{url}/api/resources", json=body, headers=headers)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_admin_routes_refuse_no_key_a_wrong_key_and_the_store_key(server, caplog) -> None:
    url, backing, root = server
    good = str(_adapter(root / "v1"))
    backing.publish_resource(ResourceVersion(name="prompt:sys", kind="prompt", payload={"template": "A"}))
    activate = {"name": "prompt:sys", "version": 1}
    with caplog.at_level(logging.INFO, logger="agentforge.stores.admin"):
        for headers, status in (
            ({}, 401),
            (_bearer("wrong-key-but-long-enough"), 401),
            (_bearer(STORE_KEY), 403),
            ({"X-Api-Key": STORE_KEY}, 403),
            ({"Authorization": f"bearer {STORE_KEY}"}, 403),
        ):
            resp = _publish(url, {"path": good}, **headers)
            assert resp.status_code == status, (headers, resp.text)
            assert (
                resp.json()["detail"]["error"] == "UserError"
                and "admin key" in resp.json()["detail"]["message"]
            )
            resp = httpx.post(f"{url}/api/resources/activate", json=activate, headers=headers)
            assert resp.status_code == status and "detail" in resp.json()
        assert backing.list_resources("policy") == []  # nothing published by any of them
        ok = _publish(url, {"path": good}, **_bearer(ADMIN_KEY))
        assert ok.status_code == 200 and ok.json()["version"] == 1 and ok.json()["active"]
        assert httpx.post(
            f"{url}/api/resources/activate", json=activate, headers={"X-Api-Key": ADMIN_KEY}
        ).is_success
    # the store key still serves the ordinary routes, reading resources included
    listed = httpx.get(f"{url}/api/resources", headers=_bearer(STORE_KEY))
    assert listed.status_code == 200 and [r["name"] for r in listed.json()] == ["policy", "prompt:sys"]
    lines = [r.getMessage() for r in caplog.records]
    refusals = [line for line in lines if "refused" in line]
    assert len(refusals) == 10 and all("127.0.0.1:" in line for line in refusals)
    assert sum("with the store key: refused 403" in line for line in refusals) == 6
    assert sum("with no key: refused 401" in line for line in refusals) == 2
    assert sum("with a wrong key: refused 401" in line for line in refusals) == 2
    done = [line for line in lines if line.endswith(": done")]
    assert len(done) == 2 and all("with the admin key" in line for line in done)
    assert any(line.startswith("admin publish 'policy'") for line in done)
    assert any(line.startswith("admin activate 'prompt:sys' v1") for line in done)


def test_adapter_paths_must_resolve_inside_the_root_without_any_network_lookup(
    server, tmp_path: Path, monkeypatch, caplog
) -> None:
    url, backing, root = server
    outside = _adapter(tmp_path / "elsewhere")  # a real adapter, only in the wrong place
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / "someorg").mkdir()
    lookups: list[str] = []
    real_getaddrinfo = socket.getaddrinfo

    def recording_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in ("127.0.0.1", "localhost", "::1"):
            lookups.append(str(host))
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", recording_getaddrinfo)
    with caplog.at_level(logging.INFO, logger="agentforge.stores.admin"):
        for path, why in (
            ("../../etc", "outside the adapter root"),
            (str(outside), "outside the adapter root"),
            ("/etc", "outside the adapter root"),
            ("link", "outside the adapter root"),
            (str(root / "link"), "outside the adapter root"),
            ("someorg/evil-adapter", "not an adapter directory"),
            ("", "non-empty string"),
            (".", "outside the adapter root"),
        ):
            resp = _publish(url, {"path": path}, **_bearer(ADMIN_KEY))
            assert resp.status_code == 400, (path, resp.text)
            assert why in resp.json()["detail"]["message"], path
        no_path = _publish(url, {"rank": 8}, **_bearer(ADMIN_KEY))
        assert no_path.status_code == 400 and "payload.path" in no_path.json()["detail"]["message"]
    assert lookups == []
    assert backing.list_resources() == []
    assert sum("failed 400" in r.getMessage() for r in caplog.records) == 9

    inside = _adapter(root / "runs" / "step-4")
    resp = _publish(url, {"path": "runs/../runs/step-4", "rank": 8}, **_bearer(ADMIN_KEY))
    assert resp.status_code == 200 and resp.json()["payload"] == {"path": os.path.realpath(inside), "rank": 8}
    # a version written around the server (straight into the database) is checked again on activation
    planted = backing.publish_resource(
        ResourceVersion(name="policy", kind="adapter", payload={"path": str(outside)}), activate=False
    )
    resp = httpx.post(
        f"{url}/api/resources/activate",
        json={"name": "policy", "version": planted.version},
        headers=_bearer(ADMIN_KEY),
    )
    assert resp.status_code == 400 and "outside the adapter root" in resp.json()["detail"]["message"]
    assert backing.get_resource("policy").version == 1  # the checked version keeps being the active one


def test_publishers_and_rollback_work_with_the_admin_key_only(server) -> None:
    url, backing, root = server
    first, second = _adapter(root / "step-1"), _adapter(root / "step-2")
    with HTTPStore(url, api_key=STORE_KEY) as plain:
        with pytest.raises(UserError, match="admin_key"):
            StorePublisher(plain).publish(first, step=1)
    with HTTPStore(url, api_key=STORE_KEY, admin_key=ADMIN_KEY) as admin:
        publisher = StorePublisher(admin)
        assert publisher.publish(first, step=1) == "policy@v1"
        assert publisher.publish(second, step=2) == "policy@v2"
        assert rollback_adapter(admin, 1).payload["path"] == os.path.realpath(first)
        assert rollback_adapter(admin, 0).payload["base"] is True
        assert admin.activate_resource("policy", 2).active
    assert [(r.version, r.active) for r in backing.list_resources("policy")] == [
        (1, False),
        (2, True),
        (3, False),
        (4, False),
    ]


def test_a_server_without_admin_key_closes_the_admin_routes(tmp_path: Path) -> None:
    root = tmp_path / "adapters"
    good = str(_adapter(root / "v1"))
    with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as backing:
        with serve_app(create_store_app(backing, api_key=STORE_KEY, adapter_root=root)) as url:
            for headers in ({}, _bearer(STORE_KEY), _bearer(ADMIN_KEY)):
                resp = _publish(url, {"path": good}, **headers)
                assert resp.status_code == 403 and "without an admin key" in resp.json()["detail"]["message"]
        with serve_app(create_store_app(backing, api_key=STORE_KEY, admin_key=ADMIN_KEY)) as url:
            resp = _publish(url, {"path": good}, **_bearer(ADMIN_KEY))  # no adapter root: no adapter paths
            assert resp.status_code == 400 and "adapter_root" in resp.json()["detail"]["message"]
            prompt = {"name": "prompt:sys", "kind": "prompt", "payload": {"template": "hi"}}
            assert httpx.post(f"{url}/api/resources", json=prompt, headers=_bearer(ADMIN_KEY)).is_success
        assert [r.name for r in backing.list_resources()] == ["prompt:sys"]


def test_weak_and_shared_keys_are_refused_when_the_app_is_built() -> None:
    store = SQLStore("sqlite://")
    try:
        with pytest.raises(UserError, match="at least 16"):
            create_store_app(store, api_key="k")
        with pytest.raises(UserError, match="admin_key has 15 characters"):
            create_store_app(store, api_key=STORE_KEY, admin_key="a" * 15)
        with pytest.raises(UserError, match="must differ"):
            create_store_app(store, api_key=STORE_KEY, admin_key=STORE_KEY)
        create_store_app(store, api_key=STORE_KEY, admin_key=ADMIN_KEY)
    finally:
        store.close()
