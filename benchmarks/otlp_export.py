"""The OTLP export's cost in the gateway: CPU milliseconds per request with the export off and on.

Two gateway processes, identical but for the export (:func:`agentforge.stores.otlp.export_to_otlp` with the
default batching: up to 512 spans per request, every 5 s), each with its own durable SQLite store, in front of
the same scripted engine (``benchmarks/gateway.py``'s); the exporting one sends OTLP/HTTP to a receiver in a
third process that decodes every request (``opentelemetry-proto``) and counts the spans. Phases alternate
off/on (``--rounds`` times) at each client count, non-streamed, so both see the same machine load. Printed: req/s
and the gateway process's CPU ms per request (``/proc/<pid>/stat``) off and on, the difference, and the spans the
receiver got against the requests answered (the export is asynchronous: counted after a last batch delay).

    python benchmarks/otlp_export.py                 # 1 and 32 clients, 5 s per phase, 2 rounds
    python benchmarks/otlp_export.py --clients 32 --seconds 10 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _spine import ChildServer, free_port  # noqa: E402
from gateway import engine_script, run_phase  # noqa: E402

from agentforge.stores.sql import SQLStore  # noqa: E402
from agentforge.types import Rollout, Task  # noqa: E402

_RECEIVER = """
import sys, uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
spans = 0
async def app(scope, receive, send):
    global spans
    if scope["type"] != "http":
        return
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    if scope["path"] == "/v1/traces":
        request = ExportTraceServiceRequest.FromString(body)
        spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        answer, kind = ExportTraceServiceResponse().SerializeToString(), b"application/x-protobuf"
    else:
        answer, kind = str(spans).encode(), b"text/plain"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
    await send({"type": "http.response.body", "body": answer})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""

_GATEWAY = """
import sys, threading
from agentforge.config import serving_gc
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.gateway.server import GatewayServer
from agentforge.stores.otlp import OTLPSettings, export_to_otlp
from agentforge.stores.sql import SQLStore
store = SQLStore({db!r})
if {receiver!r}:
    export_to_otlp(store, OTLPSettings(endpoint={receiver!r}))
router = ModelRouter()
router.register("policy@v1", Upstream(base_url={upstream!r}, model="base"))
router.set_alias("policy", "policy@v1")
GatewayServer(store, router, port=int(sys.argv[1])).start()
serving_gc()
threading.Event().wait()
"""


def _rollouts(db: str, n: int) -> list[str]:
    store = SQLStore(db)
    try:
        for i in range(n):
            store.enqueue_rollout(Rollout(task=Task(input={"i": i}), agent="bench"))
        return [c[0].rollout_id for c in (store.claim_rollout("bench") for _ in range(n)) if c]
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    """Run the alternating phases and print the table (nothing is asserted)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    p.add_argument(
        "--seconds", type=float, default=5.0, help="measured seconds per phase (after 1 s warm-up)"
    )
    p.add_argument("--rounds", type=int, default=2, help="off/on pairs per client count")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        upstream = ChildServer(engine_script(), free_port(), health="/v1/models")
        receiver = ChildServer(_RECEIVER, free_port(), health="/count")
        gateways, rollouts = {}, {}
        try:
            for mode in ("off", "on"):
                db = f"sqlite:///{Path(tmp) / f'{mode}.db'}"
                rollouts[mode] = _rollouts(db, max(args.clients))
                code = _GATEWAY.format(
                    db=db, upstream=f"{upstream.url}/v1", receiver=receiver.url if mode == "on" else ""
                )
                gateways[mode] = ChildServer(code, free_port(), timeout_s=120.0)
            rows, answered_on = [], 0
            for clients in args.clients:
                cost: dict[str, list[float]] = {"off": [], "on": []}
                rate: dict[str, list[float]] = {"off": [], "on": []}
                for _ in range(args.rounds):
                    for mode in ("off", "on"):
                        urls = [
                            f"{gateways[mode].url}/rollouts/{r}/v1/chat/completions"
                            for r in rollouts[mode][:clients]
                        ]
                        ph = run_phase("gateway", urls, False, args.seconds, gateways[mode])
                        cost[mode].append(ph.cpu_ms_per_req or float("nan"))
                        rate[mode].append(ph.req_per_s)
                        answered_on += ph.answered if mode == "on" else 0
                rows.append((clients, rate, cost))
            time.sleep(6.0)  # the export's last batch (5 s schedule delay)
            received = int(httpx.get(f"{receiver.url}/count", timeout=10).text)
            exported = httpx.get(f"{gateways['on'].url}/api/store/metrics", timeout=10).text
        finally:
            for server in (*gateways.values(), receiver, upstream):
                server.stop()
    print(
        f"\n{'clients':>7} {'r/s off':>8} {'r/s on':>8} {'CPU ms/req off':>15} {'on':>7} {'+ms':>7} {'+%':>6}"
    )
    for clients, rate, cost in rows:
        off, on = statistics.median(cost["off"]), statistics.median(cost["on"])
        print(
            f"{clients:>7} {statistics.median(rate['off']):>8,.0f} {statistics.median(rate['on']):>8,.0f} "
            f"{off:>15.3f} {on:>7.3f} {on - off:>7.3f} {100 * (on - off) / off:>5.1f}%"
        )
    print(f"(medians of {args.rounds} rounds; each round: off then on)")
    print(f"receiver got {received} spans for {answered_on} requests answered with the export on")
    print("\n".join(line for line in exported.splitlines() if not line.startswith("#")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
