"""The gateway's cost: clients → fake engine directly, against clients → gateway → the same fake engine.

The engine is the product's own :class:`~agentforge.testing.ScriptedUpstream` (vLLM-shaped answers with
``prompt_token_ids``, ``token_ids`` and logprobs; a 20-token answer, cycling forever; ``--answer`` sets another) served by uvicorn in
a child process. The gateway runs in another child process with a durable SQLite trace store
(``synchronous=FULL``) and attributes every call to one of ``C`` running rollouts through the
``/rollouts/<id>/v1`` prefix. Clients are ``C`` closed-loop asyncio tasks sharing one aiohttp keep-alive pool in
this process; everything binds 127.0.0.1 and stops by itself.

Phases, each for ``--seconds`` after a warm-up, at 1 and 32 clients, non-streamed and streamed:
direct, direct with the gateway's capture options (the sampled ids and log-probs the gateway asks the engine
for, so the engine does the same work as behind the gateway; the issue's anchor engine returned them to every
call), then through the gateway, then through a relay that only copies bytes (the floor: what is left of direct
throughput once any Python process sits in the path); all of it ``--rounds`` times over, alternating, because this machine's speed
drifts by up to 2× within minutes. Printed per round: req/s, the ratio gateway/direct (and gateway/direct
with capture), the latency the gateway adds at p50 and p99 (gateway percentile minus direct percentile), the
gateway's and the engine's CPU milliseconds per request (``/proc/<pid>/stat``), and whether requests sent ==
spans stored; then the medians over rounds, of ratios taken within a round. Then the targets of issue 11:
≥ 0.5× direct at 32 clients, p99 ≤ 100 ms, ≤ 1 ms CPU per request, +≤ 2 ms at p50 with 1 client, streaming
within 1.5× of non-streaming cost (the CPU per streamed call ÷ per plain call, within each round; printed beside
the same ratio of the byte-copying relay and of the engine, whose per-event costs any relay of a stream pays).

    python benchmarks/gateway.py                   # 1 and 32 clients, 5 s per phase, 3 rounds
    python benchmarks/gateway.py --clients 32 --seconds 10 --rounds 5 --json
    python benchmarks/gateway.py --clients 32 --answer Thanks!   # a 2-token answer: 5 stream events
    python benchmarks/gateway.py --privacy mask --unique   # masking on, each request's text new (no cache)
    python benchmarks/gateway.py --privacy mask --unique --pii   # and each carrying a card and an email
    python benchmarks/gateway.py --clients 32 --prompt-tokens 2000   # an agent's prompt: 2,000 ids, ~16 kB of text
    python benchmarks/gateway.py --clients 32 --lean   # and the leanest capture proxy (benchmarks/lean_capture.py)
    python benchmarks/gateway.py --clients 32 --dialects   # and the Responses / Messages routes beside chat
    python benchmarks/gateway.py --clients 32 --workers 1 2 4   # 1, 2, 4 gateway replicas behind HAProxy

``--workers N ...``: instead of the phases above, N gateway processes (replicas) on one store behind HAProxy
(:mod:`agentforge.scale.haproxy`: a rollout's calls reach one replica by consistent hashing of its id in the
URL), for each N, beside direct calls in every round: throughput, the ratio to direct, the replicas' CPU per
call (all of them together) and HAProxy's, and requests answered == spans stored. ``--store-url`` names the
replicas' store (default: one SQLite file; a PostgreSQL URL for the deployment's form). On a 2-core host the
replicas share the cores with the engine and the clients, so the figure cannot scale there; it is recorded
for a larger machine.

``--lean`` adds a fifth phase after the relay: the same requests through :mod:`lean_capture`, the least work
any gateway with durable token-exact capture must do (one decode and one encode of each body or event, one
committed row per call; no keys, routing, attribution, validation or privacy). It is the floor *with
capture*: the share of direct throughput, and the streamed ÷ plain CPU, that a Python gateway keeps when
every product feature is taken away.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _spine import ChildServer, cpu_seconds, free_port, percentile  # noqa: E402
from lean_capture import stored_rows  # noqa: E402

from agentforge.gateway.router import Upstream  # noqa: E402
from agentforge.gateway.wire import upstream_body  # noqa: E402
from agentforge.stores.sql import SQLStore  # noqa: E402
from agentforge.types import Rollout, Task  # noqa: E402

_UPSTREAM = """
import sys, uvicorn
from agentforge.testing import ScriptedTurn, ScriptedUpstream
turn = ScriptedTurn({answer!r}, prompt_token_ids={prompt_ids})
up = ScriptedUpstream([turn], cycle=True)
uvicorn.run(up.app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""

_GATEWAY = r"""
import sys, threading
from agentforge.config import serving_gc
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.gateway.server import GatewayServer
from agentforge.privacy import PrivacyConfig
from agentforge.open import open_store
privacy = PrivacyConfig(mode={privacy!r}, patterns={{"ACCOUNT": r"ACME-\d{{8}}"}})
router = ModelRouter()
router.register("policy@v1", Upstream(base_url={upstream!r}, model="base"))
router.set_alias("policy", "policy@v1")
GatewayServer(open_store({db!r}), router, port=int(sys.argv[1]), privacy=privacy).start()
serving_gc()  # as `agentforge serve` does after start-up
threading.Event().wait()
"""

#: The floor: the thinnest relay a Python process can be, on the gateway's event loop (uvloop). Each client
#: connection gets its own engine connection and the bytes are copied both ways as they arrive: no HTTP
#: parsing, no JSON, no capture, no span. Whatever it costs, every gateway written in Python pays too.
_RELAY = """
import asyncio, sys
try:
    import uvloop
    run = uvloop.run
except ImportError:
    run = asyncio.run
class Engine(asyncio.Protocol):
    def __init__(self, client): self.client = client
    def data_received(self, data): self.client.write(data)
    def connection_lost(self, exc): self.client.close()
class Client(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.engine, self.early = transport, None, []
        asyncio.ensure_future(self.connect())
    async def connect(self):
        loop = asyncio.get_running_loop()
        self.engine, _ = await loop.create_connection(lambda: Engine(self.transport), "127.0.0.1", {port})
        for data in self.early:
            self.engine.write(data)
    def data_received(self, data):
        if self.engine is None:
            self.early.append(data)
        else:
            self.engine.write(data)
    def connection_lost(self, exc):
        if self.engine is not None:
            self.engine.close()
async def main():
    server = await asyncio.get_running_loop().create_server(Client, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
run(main())
"""

#: ``--lean``: :mod:`lean_capture` in a child process (``{bench}``: this folder, ``{engine}``: the engine's port,
#: ``{db}``: its SQLite file).
_LEAN = """
import sys
sys.path.insert(0, {bench!r})
from lean_capture import main
main([sys.argv[1], {engine!r}, {db!r}])
"""

#: The engine's answer to every call: 20 tokens of 4 characters, so a stream carries 23 events (the
#: assistant role, 20 tokens with the last one finishing, the usage chunk) before ``[DONE]``.
ANSWER = "Your order #1234 ships tomorrow; the tracking number follows by email. Thanks!"

BODY = {
    "model": "policy",
    "messages": [
        {"role": "system", "content": "You are a helpful customer-service agent for an online shop."},
        {"role": "user", "content": "Hi, where is my order #1234? It was due yesterday."},
    ],
    "max_tokens": 24,
    "temperature": 1.0,
}


@dataclass
class Phase:
    """One measured phase."""

    target: str
    clients: int
    stream: bool
    requests: int
    errors: int
    seconds: float
    req_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_req: float | None = None
    answered: int = 0
    engine_cpu_ms_per_req: float | None = None
    spans_stored: int | None = None
    round: int = 1


#: ``--pii``: the user message of every request (``{n}``: the request's number under ``--unique``)
PII_TEXT = "Hi, order #{n} is late. My card is 4111 1111 1111 1111, mail me at jane.roe{n}@example.com."


def system_prompt(prompt_tokens: int) -> str:
    """The system message of every request: :data:`BODY`'s, or with ``prompt_tokens`` > 0 that many more words
    of rules (about 8 characters each), as long as an agent's instructions and tool descriptions get."""
    text = BODY["messages"][0]["content"]
    return text + "".join(f" rule{i}." for i in range(prompt_tokens)) if prompt_tokens > 0 else text


def engine_prompt_ids(prompt_tokens: int) -> list[int] | None:
    """The prompt ids the fake engine returns with every answer for ``--prompt-tokens`` (``None``: its own
    fake ids of the request's text, a few dozen)."""
    return list(range(1000, 1000 + prompt_tokens)) if prompt_tokens > 0 else None


def engine_script(answer: str = ANSWER, prompt_tokens: int = 0) -> str:
    """The fake engine's child-process script (:data:`_UPSTREAM`): ``answer`` to every call, with
    :func:`engine_prompt_ids` ``(prompt_tokens)`` as its prompt ids."""
    return _UPSTREAM.format(answer=answer, prompt_ids=engine_prompt_ids(prompt_tokens))


def dialect_body(body: dict[str, Any], dialect: str) -> dict[str, Any]:
    """A chat request body as the same call in another API the gateway serves: the Responses API
    (``responses``: instructions, input, max_output_tokens) or the Anthropic Messages API (``messages``:
    system, messages, max_tokens)."""
    system, *rest = body["messages"]
    if dialect == "responses":
        return {
            "model": body["model"],
            "instructions": system["content"],
            "input": rest,
            "max_output_tokens": body["max_tokens"],
            "stream": body["stream"],
        }
    return {
        "model": body["model"],
        "system": system["content"],
        "messages": rest,
        "max_tokens": body["max_tokens"],
        "stream": body["stream"],
    }


def _bodies(
    model: str,
    stream: bool,
    unique: bool,
    pii: bool,
    capture: bool = False,
    prompt_tokens: int = 0,
    dialect: str = "chat",
) -> Iterator[bytes]:
    """The request bodies: one body over and over, or (``unique``) a new user text per request; ``capture``:
    each as the gateway sends it to the engine (``wire.upstream_body``: with the sampled tokens' ids and
    log-probs, and the usage chunk of a stream), so the engine does the gateway phase's work;
    ``prompt_tokens``: the system message's length (:func:`system_prompt`)."""
    engine = Upstream(base_url="", model=model)  # only its model name and capture options are read
    text = PII_TEXT if pii else BODY["messages"][1]["content"].replace("#1234", "#{n}")
    system = {"role": "system", "content": system_prompt(prompt_tokens)}
    for n in itertools.count(1000):
        messages = [system, {"role": "user", "content": text.format(n=n if unique else 1234)}]
        body = {**BODY, "messages": messages, "model": model, "stream": stream}
        if dialect != "chat":
            yield json.dumps(dialect_body(body, dialect)).encode()
            continue
        yield json.dumps(upstream_body(body, "chat", engine) if capture else body).encode()


async def _load(
    urls: list[str],
    model: str,
    stream: bool,
    seconds: float,
    warmup_s: float,
    unique: bool = False,
    pii: bool = False,
    capture: bool = False,
    prompt_tokens: int = 0,
    dialect: str = "chat",
) -> tuple[list[float], int, int, float]:
    """Closed-loop clients, one per URL: latencies (s) of the requests started after the warm-up, errors,
    all requests answered (warm-up included) and the measured window (s). Each client measures at least one
    request, so a phase on a busy host (a first call slower than the warm-up) still has a figure; the window
    then stretches to the last measured request's end, and rates divide by it."""
    latencies: list[float] = []
    errors = answered = 0
    last_end = 0.0
    bodies = _bodies(model, stream, unique, pii, capture, prompt_tokens, dialect)
    body = next(bodies)
    headers = {"content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=len(urls))  # aiohttp: a load generator cheaper than the server
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:
        start = time.perf_counter()
        measure_from, stop_at = start + warmup_s, start + warmup_s + seconds

        async def worker(url: str) -> None:
            nonlocal errors, answered, last_end
            measured = 0
            while (t0 := time.perf_counter()) < stop_at or not measured:
                data = next(bodies) if unique else body
                try:
                    async with client.post(url, data=data, headers=headers) as r:
                        await r.read()
                        ok = r.status == 200
                except aiohttp.ClientError:
                    ok = False
                t1 = time.perf_counter()
                answered += ok
                if t0 >= measure_from:
                    measured += 1
                    last_end = max(last_end, t1)
                    if ok:
                        latencies.append(t1 - t0)
                    else:
                        errors += 1

        await asyncio.gather(*(worker(u) for u in urls))
    return latencies, errors, answered, max(seconds, last_end - measure_from)


def run_phase(
    target: str,
    urls: list[str],
    stream: bool,
    seconds: float,
    cpu: ChildServer | Replicas | None,
    unique: bool = False,
    pii: bool = False,
    engine: ChildServer | None = None,
    capture: bool = False,
    model: str | None = None,
    prompt_tokens: int = 0,
    dialect: str = "chat",
    warmup_s: float = 1.0,
) -> Phase:
    """Measure one phase; ``cpu``: the process whose CPU time is charged per request (the gateway, or the
    relay); ``engine``: the engine, whose CPU per request is reported too; ``capture``: the requests are sent
    as the gateway sends them to the engine (see :func:`_bodies`); ``model``: the model named in them (by
    default the engine's own name directly, the gateway's alias through a gateway)."""
    cpu0 = cpu.cpu_s() if cpu else 0.0
    engine0 = engine.cpu_s() if engine else 0.0
    model = model or ("base" if cpu is None else "policy")
    latencies, errors, answered, window = asyncio.run(
        _load(urls, model, stream, seconds, warmup_s, unique, pii, capture, prompt_tokens, dialect)
    )
    n = len(latencies)
    cpu_ms = engine_ms = None
    if answered:  # each process's CPU over every request it answered in the phase
        if cpu is not None:
            cpu_ms = round((cpu.cpu_s() - cpu0) * 1000 / answered, 3)
        if engine is not None:
            engine_ms = round((engine.cpu_s() - engine0) * 1000 / answered, 3)
    return Phase(
        target,
        len(urls),
        stream,
        n,
        errors,
        round(window, 3),
        round(n / window, 1),
        round(percentile(latencies, 50) * 1000, 2),
        round(percentile(latencies, 99) * 1000, 2),
        cpu_ms,
        answered=answered,
        engine_cpu_ms_per_req=engine_ms,
    )


def main(argv: list[str] | None = None) -> int:
    """Run every phase and print the table (targets are reported, not asserted)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    p.add_argument(
        "--seconds", type=float, default=5.0, help="measured seconds per phase (after --warmup-s of warm-up)"
    )
    p.add_argument("--warmup-s", type=float, default=1.0, help="unmeasured seconds before each phase")
    p.add_argument(
        "--rounds", type=int, default=3, help="rounds of every phase, alternating; medians are reported"
    )
    p.add_argument("--json", action="store_true", help="print the phases as one JSON line at the end")
    p.add_argument(
        "--privacy", choices=["off", "mask", "redact"], default="off", help="the gateway's privacy mode"
    )
    p.add_argument(
        "--unique", action="store_true", help="a new user text per request (no masking cache hits)"
    )
    p.add_argument(
        "--answer",
        default=ANSWER,
        help="the engine's answer to every call (one token per 4 characters; a stream has one event per token)",
    )
    p.add_argument("--pii", action="store_true", help="every user text carries a card number and an email")
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=0,
        help="the prompt's length in ids, which the engine returns with every answer, and about 8 characters of "
        "system message each (default 0: the short body, a few dozen ids)",
    )
    p.add_argument(
        "--lean",
        action="store_true",
        help="also measure the leanest capture proxy (benchmarks/lean_capture.py): the floor with capture",
    )
    p.add_argument(
        "--dialects",
        action="store_true",
        help="also measure the same calls through the gateway's Responses API and Anthropic Messages API routes "
        "(their CPU per call beside the chat route's, within each round)",
    )
    p.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=None,
        help="gateway replica counts to measure behind HAProxy (e.g. 1 2 4) instead of the usual phases",
    )
    p.add_argument(
        "--store-url",
        default=None,
        help="--workers: the replicas' store (default: one SQLite file in a temporary folder)",
    )
    args = p.parse_args(argv)
    if args.workers:
        return run_replicas(args)
    phases: list[Phase] = []
    dialects: list[tuple[Phase, Phase]] = []  # (chat gateway phase, dialect phase) of one round
    with (
        tempfile.TemporaryDirectory() as tmp,
        ExitStack() as children,
    ):  # every child stopped, even on a failed start
        db = f"sqlite:///{Path(tmp) / 'gateway.db'}"
        store = SQLStore(db)
        children.callback(store.close)
        rollout_ids = running_rollouts(store, max(args.clients))

        def child(code: str, **kwargs: Any) -> ChildServer:
            server = ChildServer(code, free_port(), **kwargs)
            children.callback(server.stop)
            return server

        upstream = child(engine_script(args.answer, args.prompt_tokens), health="/v1/models")
        script = _GATEWAY.format(upstream=f"{upstream.url}/v1", db=db, privacy=args.privacy)
        gateway = child(script, timeout_s=120.0)  # Presidio's import: seconds
        relay = child(_RELAY.format(port=upstream.port), health="/v1/models")
        lean_db = str(Path(tmp) / "lean.db")
        bench = str(Path(__file__).resolve().parent)
        lean = (
            child(_LEAN.format(bench=bench, engine=str(upstream.port), db=lean_db), health="/v1/models")
            if args.lean
            else None
        )
        for clients in args.clients:
            direct_urls = [f"{upstream.url}/v1/chat/completions"] * clients
            relay_urls = [f"{relay.url}/v1/chat/completions"] * clients
            gw_urls = gw_urls_for(gateway.url, rollout_ids[:clients])
            lean_urls = gw_urls_for(lean.url, rollout_ids[:clients]) if lean is not None else []
            load = {
                "unique": args.unique,
                "pii": args.pii,
                "prompt_tokens": args.prompt_tokens,
                "warmup_s": args.warmup_s,
            }
            for round_ in range(1, args.rounds + 1):  # rounds alternate, so drift hits every phase alike
                for stream in (False, True):
                    direct = run_phase(
                        "direct", direct_urls, stream, args.seconds, None, engine=upstream, **load
                    )
                    captured = run_phase(
                        "direct+capture",
                        direct_urls,
                        stream,
                        args.seconds,
                        None,
                        engine=upstream,
                        capture=True,
                        **load,
                    )
                    before = _count(store, rollout_ids)
                    ph = run_phase("gateway", gw_urls, stream, args.seconds, gateway, engine=upstream, **load)
                    ph.spans_stored = _count(store, rollout_ids) - before  # acknowledged = committed
                    floor = run_phase(
                        "relay",
                        relay_urls,
                        stream,
                        args.seconds,
                        relay,
                        engine=upstream,
                        capture=True,
                        model="base",
                        **load,
                    )
                    measured = [direct, captured, ph, floor]
                    if lean is not None:
                        before = stored_rows(lean_db)
                        measured.append(
                            run_phase("lean", lean_urls, stream, args.seconds, lean, engine=upstream, **load)
                        )
                        measured[-1].spans_stored = stored_rows(lean_db) - before
                    for phase in measured:
                        phase.round = round_
                        phases.append(phase)
                    for dialect in ("responses", "messages") if args.dialects else ():
                        urls = [u.replace("/chat/completions", f"/{dialect}") for u in gw_urls]
                        before = _count(store, rollout_ids)
                        other = run_phase(
                            f"gateway-{dialect}",
                            urls,
                            stream,
                            args.seconds,
                            gateway,
                            engine=upstream,
                            dialect=dialect,
                            **load,
                        )
                        other.spans_stored, other.round = _count(store, rollout_ids) - before, round_
                        dialects.append((ph, other))
    _report(phases)
    if dialects:
        _dialect_report(dialects)
    if args.json:  # the dialect phases (--dialects) after the others
        print(json.dumps([asdict(ph) for ph in phases] + [asdict(other) for _, other in dialects]))
    return 0


class Replicas:
    """``n`` gateway replicas (:data:`_GATEWAY`, on any store URL :func:`agentforge.open.open_store` takes),
    each a :class:`ChildServer`; :meth:`cpu_s` sums them."""

    def __init__(self, n: int, engine_url: str, store_url: str, privacy: str) -> None:
        self.children: list[ChildServer] = []
        script = _GATEWAY.format(upstream=engine_url, db=store_url, privacy=privacy)
        try:
            for _ in range(n):
                self.children.append(ChildServer(script, free_port(), timeout_s=120.0))
        except BaseException:
            self.stop()
            raise

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{c.port}" for c in self.children]

    def cpu_s(self) -> float:
        return sum(c.cpu_s() for c in self.children)

    def stop(self) -> None:
        for child in self.children:
            child.stop()


def run_replicas(args: argparse.Namespace) -> int:
    """``--workers``: per replica count and round, direct then through HAProxy to the replicas; one table."""
    from agentforge.open import open_store
    from agentforge.scale.haproxy import HAProxy

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as children:
        store_url = args.store_url or f"sqlite:///{Path(tmp) / 'replicas.db'}"
        store = open_store(store_url)
        children.callback(store.close)
        rollout_ids = running_rollouts(store, max(args.clients))
        upstream = ChildServer(engine_script(args.answer, args.prompt_tokens), free_port(), "/v1/models")
        children.callback(upstream.stop)
        load = {
            "unique": args.unique,
            "pii": args.pii,
            "prompt_tokens": args.prompt_tokens,
            "warmup_s": args.warmup_s,
        }
        print(
            f"\n{'round':>5} {'workers':>7} {'clients':>7} {'stream':>6} {'direct r/s':>10} {'via r/s':>8} "
            f"{'ratio':>6} {'p99 ms':>8} {'CPU ms/req':>10} {'HAProxy CPU':>11} {'sent':>6} {'spans':>6} {'err':>4}"
        )
        for workers in args.workers:
            with ExitStack() as group:
                replicas = Replicas(workers, f"{upstream.url}/v1", store_url, args.privacy)
                group.callback(replicas.stop)
                balancer = HAProxy(replicas.addresses, free_port())
                group.callback(balancer.stop)
                for clients in args.clients:
                    for round_ in range(1, args.rounds + 1):
                        for stream in (False, True):
                            direct_urls = [f"{upstream.url}/v1/chat/completions"] * clients
                            direct = run_phase("direct", direct_urls, stream, args.seconds, None, **load)
                            before, lb0 = _count(store, rollout_ids[:clients]), cpu_seconds(balancer.pid)
                            urls = gw_urls_for(balancer.url, rollout_ids[:clients])
                            ph = run_phase(
                                "replicas", urls, stream, args.seconds, replicas, engine=upstream, **load
                            )
                            spans = _count(store, rollout_ids[:clients]) - before
                            lb_ms = (
                                (cpu_seconds(balancer.pid) - lb0) * 1000 / ph.answered
                                if ph.answered
                                else float("nan")
                            )
                            row = {
                                "workers": workers,
                                "clients": clients,
                                "stream": stream,
                                "round": round_,
                                "direct": direct.req_per_s,
                                "via": ph.req_per_s,
                                "ratio": ph.req_per_s / direct.req_per_s
                                if direct.req_per_s
                                else float("nan"),
                                "p99": ph.p99_ms,
                                "cpu": ph.cpu_ms_per_req or float("nan"),
                                "haproxy_cpu": round(lb_ms, 3),
                                "sent": ph.answered,
                                "spans": spans,
                                "err": ph.errors + direct.errors,
                            }
                            rows.append(row)
                            print(_replica_row(row, f"{round_:>5}"), flush=True)
    print("\nmedian over rounds:")
    keys = sorted({(r["workers"], r["clients"], r["stream"]) for r in rows})
    for key in keys:
        runs = [r for r in rows if (r["workers"], r["clients"], r["stream"]) == key]
        median = {
            k: statistics.median(r[k] for r in runs)
            for k in ("direct", "via", "ratio", "p99", "cpu", "haproxy_cpu")
        }
        median.update({k: sum(r[k] for r in runs) for k in ("sent", "spans", "err")})
        print(_replica_row({**runs[0], **median}, f"{'':>5}"))
    print(
        "(replicas: gateway processes behind HAProxy, a rollout's calls on one replica; CPU ms/req: all replicas "
        "together, HAProxy apart; sent = calls the replicas answered, warm-up included; spans = spans stored)"
    )
    if args.json:
        print(json.dumps(rows))
    return 0


def _replica_row(row: dict[str, Any], lead: str) -> str:
    return (
        f"{lead} {row['workers']:>7} {row['clients']:>7} {str(row['stream']):>6} {row['direct']:>10,.0f} "
        f"{row['via']:>8,.0f} {row['ratio']:>5.2f}× {row['p99']:>8.1f} {row['cpu']:>10.3f} {row['haproxy_cpu']:>11.3f} "
        f"{row['sent']:>6.0f} {row['spans']:>6.0f} {row['err']:>4.0f}"
    )


def running_rollouts(store: Any, n: int) -> list[str]:
    """``n`` rollouts enqueued and claimed (running) in ``store``, one per client; their ids."""
    for i in range(n):
        store.enqueue_rollout(Rollout(task=Task(input={"i": i}), agent="bench"))
    return [c[0].rollout_id for c in (store.claim_rollout("bench") for _ in range(n)) if c]


def gw_urls_for(base: str, rollout_ids: list[str]) -> list[str]:
    """One chat URL per client, each under its rollout's ``/rollouts/<id>/v1`` prefix on ``base``."""
    return [f"{base}/rollouts/{rid}/v1/chat/completions" for rid in rollout_ids]


def _count(store: SQLStore, rollout_ids: list[str]) -> int:
    return sum(len(store.list_spans(rollout_id=r)) for r in rollout_ids)


def _report(phases: list[Phase]) -> None:
    """Print one row per round and configuration, then the medians over rounds: the ratios and the
    streamed ÷ non-streamed CPU are taken within each round (phases measured minutes apart on a noisy
    machine are not compared) and their median is the figure against the target. The relay's columns are the
    floor: the share of direct throughput left once any Python process sits in the path."""
    rows: dict[tuple[int, bool], list[dict[str, float]]] = {}
    print(
        f"\n{'round':>5} {'clients':>7} {'stream':>6} {'direct r/s':>10} {'gw r/s':>8} {'ratio':>6} {'+p50 ms':>8} "
        f"{'+p99 ms':>8} {'gw p99':>7} {'CPU ms/req':>10} {'sent':>6} {'spans':>6} {'err':>4}"
        f" {'+capture r/s':>12} {'ratio':>6} {'relay r/s':>9} {'ratio':>6} {'relay CPU':>9}"
        f" {'engine ms/req: direct / +capture / via gw':>42}"
    )
    width = 5 if any(ph.target == "lean" for ph in phases) else 4  # --lean: a fifth phase per group
    for direct, captured, gw, relay, *lean in (phases[i : i + width] for i in range(0, len(phases), width)):
        row = {
            "direct": direct.req_per_s,
            "gw": gw.req_per_s,
            "ratio": gw.req_per_s / direct.req_per_s if direct.req_per_s else float("nan"),
            "p50": gw.p50_ms - direct.p50_ms,
            "p99": gw.p99_ms - direct.p99_ms,
            "gw_p99": gw.p99_ms,
            "cpu": gw.cpu_ms_per_req or float("nan"),
            "sent": gw.answered,
            "spans": gw.spans_stored if gw.spans_stored is not None else -1,
            "err": gw.errors + direct.errors + captured.errors,
            "captured": captured.req_per_s,
            "ratio_c": gw.req_per_s / captured.req_per_s if captured.req_per_s else float("nan"),
            "relay": relay.req_per_s,
            "ratio_r": relay.req_per_s / direct.req_per_s if direct.req_per_s else float("nan"),
            "relay_cpu": relay.cpu_ms_per_req or float("nan"),
            "engine_cpu": captured.engine_cpu_ms_per_req or float("nan"),
            "relay_p50": relay.p50_ms - direct.p50_ms,
        }
        if lean:
            row.update(
                {
                    "lean": lean[0].req_per_s,
                    "ratio_l": lean[0].req_per_s / direct.req_per_s if direct.req_per_s else float("nan"),
                    "ratio_lc": lean[0].req_per_s / captured.req_per_s
                    if captured.req_per_s
                    else float("nan"),
                    "lean_cpu": lean[0].cpu_ms_per_req or float("nan"),
                    "lean_sent": lean[0].answered,
                    "lean_rows": lean[0].spans_stored if lean[0].spans_stored is not None else -1,
                    "lean_err": lean[0].errors,
                    "err": row["err"] + lean[0].errors,
                }
            )
        rows.setdefault((gw.clients, gw.stream), []).append(row)
        engine = " / ".join(
            f"{ph.engine_cpu_ms_per_req or float('nan'):.3f}" for ph in (direct, captured, gw)
        )
        print(f"{gw.round:>5} {_row(gw.clients, gw.stream, row)} {engine:>42}")
    print("\nmedian over rounds:")
    for (clients, stream), runs in sorted(rows.items()):
        median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        totals = ("sent", "spans", "err", "lean_sent", "lean_rows", "lean_err")
        median.update({key: sum(run[key] for run in runs) for key in totals if key in runs[0]})
        print(f"{'':>5} {_row(clients, stream, median)}")
    print(
        "(sent = requests the gateway answered in the phase, warm-up included; spans = spans stored;"
        " +capture: direct requests with the gateway's capture options, ids and log-probs, so the engine"
        " does the gateway phase's work; ratio = gateway r/s ÷ that phase's r/s; relay: the same requests"
        " through a process that only copies bytes (no parsing, capture or span), its ratio = relay r/s ÷"
        " direct r/s)"
    )
    for (clients, stream), runs in sorted(rows.items()):
        floor = statistics.median(run["ratio_r"] for run in runs)
        reached = statistics.median(run["gw"] / run["relay"] for run in runs if run["relay"])
        print(
            f"floor at {clients} clients, {'streamed' if stream else 'plain'}: a byte-copying relay reaches "
            f"{floor:.2f}× of direct at {statistics.median(run['relay_cpu'] for run in runs):.3f} ms CPU a call,"
            f" +{statistics.median(run['relay_p50'] for run in runs):.2f} ms at p50; the gateway reaches"
            f" {reached:.2f}× of the relay's throughput"
        )
    for (clients, stream), runs in sorted(rows.items()):
        if "lean" not in runs[0]:
            break
        per_round = " ".join(f"{run['ratio_l']:.2f}" for run in runs)
        print(
            f"lean capture at {clients} clients, {'streamed' if stream else 'plain'}: the leanest capture proxy "
            f"reaches {statistics.median(run['ratio_l'] for run in runs):.2f}× of direct (rounds: {per_round}), "
            f"{statistics.median(run['ratio_lc'] for run in runs):.2f}× of direct+capture, at "
            f"{statistics.median(run['lean_cpu'] for run in runs):.3f} ms CPU a call; sent "
            f"{sum(run['lean_sent'] for run in runs):.0f} = stored {sum(run['lean_rows'] for run in runs):.0f}, "
            f"{sum(run['lean_err'] for run in runs):.0f} errors; "
            f"the gateway reaches {statistics.median(run['gw'] / run['lean'] for run in runs if run['lean']):.2f}×"
            " of its throughput"
        )
    for (clients, stream), runs in sorted(rows.items()):
        plain = rows.get((clients, False))
        if stream and plain:
            per_round = [s["cpu"] / p["cpu"] for s, p in zip(runs, plain, strict=True)]
            relay, engine = (
                statistics.median(s[key] / p[key] for s, p in zip(runs, plain, strict=True))
                for key in ("relay_cpu", "engine_cpu")
            )
            lean_ratio = (
                f", of the leanest capture proxy: "
                f"{statistics.median(s['lean_cpu'] / p['lean_cpu'] for s, p in zip(runs, plain, strict=True)):.2f}×"
                if "lean_cpu" in runs[0]
                else ""
            )
            print(
                f"streaming/non-streaming CPU cost at {clients} clients: {statistics.median(per_round):.2f}× "
                f"(median; rounds: {' '.join(f'{r:.2f}' for r in per_round)}); the same ratio of the byte-copying "
                f"relay: {relay:.2f}×, of the engine answering direct+capture: {engine:.2f}×{lean_ratio}"
            )


def _dialect_report(pairs: list[tuple[Phase, Phase]]) -> None:
    """The other dialects' routes beside the chat route: CPU per call and its ratio to the chat route's in the
    same round (issue 38's target: within 1.3×), throughput, and requests answered = spans stored."""
    groups: dict[tuple[str, int, bool], list[tuple[Phase, Phase]]] = {}
    for chat, other in pairs:
        groups.setdefault((other.target, other.clients, other.stream), []).append((chat, other))
    print(
        f"\n{'route':>18} {'clients':>7} {'stream':>6} {'r/s':>8} {'chat r/s':>8} {'CPU ms/req':>10} "
        f"{'chat CPU':>8} {'CPU ratio (rounds)':>28} {'sent':>6} {'spans':>6} {'err':>4}"
    )
    for (target, clients, stream), runs in sorted(groups.items()):
        ratios = [
            o.cpu_ms_per_req / c.cpu_ms_per_req for c, o in runs if o.cpu_ms_per_req and c.cpu_ms_per_req
        ]
        rounds = " ".join(f"{r:.2f}" for r in ratios)
        median = statistics.median(ratios) if ratios else float("nan")
        print(
            f"{target:>18} {clients:>7} {str(stream):>6} {statistics.median(o.req_per_s for _, o in runs):>8,.0f} "
            f"{statistics.median(c.req_per_s for c, _ in runs):>8,.0f} "
            f"{statistics.median(o.cpu_ms_per_req or float('nan') for _, o in runs):>10.3f} "
            f"{statistics.median(c.cpu_ms_per_req or float('nan') for c, _ in runs):>8.3f} "
            f"{median:>6.2f}× ({rounds:>18}) {sum(o.answered for _, o in runs):>6} "
            f"{sum(o.spans_stored or 0 for _, o in runs):>6} {sum(o.errors for _, o in runs):>4}"
        )


def _row(clients: int, stream: bool, row: dict[str, float]) -> str:
    return (
        f"{clients:>7} {str(stream):>6} {row['direct']:>10,.0f} {row['gw']:>8,.0f} {row['ratio']:>5.2f}× "
        f"{row['p50']:>8.2f} {row['p99']:>8.2f} {row['gw_p99']:>7.1f} {row['cpu']:>10.3f} {row['sent']:>6.0f} "
        f"{row['spans']:>6.0f} {row['err']:>4.0f} {row['captured']:>12,.0f} {row['ratio_c']:>5.2f}× "
        f"{row['relay']:>9,.0f} {row['ratio_r']:>5.2f}× {row['relay_cpu']:>9.3f}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
