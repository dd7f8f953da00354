"""More tenants than adapter slots on the session's real vLLM: 8 concurrent clients spread over 6 tenants, each with
its own adapter version, through the real gateway with serving's TenantAdapters loading and unloading them.

Each tenant's adapter is a copy of a letter adapter (tenants t0..t5 answer A, B, C, A, B, C), so an answer shows
which weights served it and the span shows which version: 0 failed requests, every answer is its tenant's letter,
every span names its tenant's own version, versions were unloaded and reloaded, and the engine never held more
than the allowed number of tenant adapters."""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from adapters import LETTER_MESSAGES

from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.tenants import TenantAdapters
from agentforge.serving.vllm import VLLMServer
from agentforge.testing import memory_store
from agentforge.types import TENANT_HEADER, ResourceVersion

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TENANTS = {f"t{i}": "ABC"[i % 3] for i in range(6)}
CLIENTS, CALLS = 8, 3


def test_eight_clients_over_six_tenants_with_fewer_adapter_slots(
    vllm_server: VLLMServer, letter_adapters: dict[str, Path], tmp_path: Path
) -> None:
    store = memory_store()
    for tenant, letter in TENANTS.items():
        own = shutil.copytree(letter_adapters[letter], tmp_path / tenant)
        store.publish_resource(
            ResourceVersion(name=f"policy@{tenant}", kind="adapter", payload={"path": str(own)})
        )
    router = ModelRouter()
    HotSwapper(vllm_server, router).register_base()  # the shared policy: the base model
    others = set(vllm_server.adapters()) - {vllm_server.base_model_name}
    capacity = (vllm_server.max_cpu_loras or vllm_server.max_loras) - len(others)
    assert capacity >= 2, f"the session's vLLM has {len(others)} adapters loaded by other tests: {others}"
    adapters = TenantAdapters(vllm_server, router, store, max_loaded=min(3, capacity))
    most_loaded = [0]
    stop = threading.Event()

    def watch() -> None:  # the engine's own list, sampled while the clients run
        while not stop.wait(0.1):
            most_loaded[0] = max(most_loaded[0], len(set(vllm_server.adapters()) - others) - 1)

    watcher = threading.Thread(target=watch, daemon=True)
    answers: list[tuple[str, int, str]] = []
    try:
        with GatewayServer(store, router, tenant_models=adapters, tenant_header=True) as gateway:
            watcher.start()

            def client(i: int) -> list[tuple[str, int, str]]:
                out = []
                with httpx.Client(base_url=f"{gateway.url}/v1", timeout=120) as http:
                    for k in range(CALLS):
                        tenant = f"t{(i + 5 * k) % 6}"
                        body = {
                            "model": "policy",
                            "messages": LETTER_MESSAGES,
                            "temperature": 0,
                            "max_tokens": 4,
                        }
                        r = http.post("/chat/completions", json=body, headers={TENANT_HEADER: tenant})
                        text = (
                            r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text
                        )
                        out.append((tenant, r.status_code, text))
                return out

            with ThreadPoolExecutor(CLIENTS) as pool:
                for got in pool.map(client, range(CLIENTS)):
                    answers.extend(got)
    finally:
        stop.set()
        adapters.close()
    failed = [a for a in answers if a[1] != 200]
    assert failed == [] and len(answers) == CLIENTS * CALLS
    assert all(text == TENANTS[tenant] for tenant, _, text in answers), answers
    spans = [s for s in store.list_spans() if s.llm is not None]
    assert len(spans) == CLIENTS * CALLS
    assert all(s.status == "ok" and s.llm.version == f"policy@{s.tenant}/v1" for s in spans)  # type: ignore[union-attr]
    metrics = adapters.metrics()
    assert metrics["tenants/evictions"] > 0 and metrics["tenants/loads"] > len(
        TENANTS
    )  # unloaded and reloaded
    assert metrics["tenants/cold_starts"] >= len(TENANTS) and 1 <= most_loaded[0] <= adapters.max_loaded
    store.close()
