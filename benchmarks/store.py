"""Span ingest of the trace store: group commit against one transaction per span, side by side.

For each backend (durable SQLite file with ``synchronous=FULL``, PostgreSQL when a URL is given, and the
HTTP store API in front of each, served by a child process on 127.0.0.1), ``W`` writer threads each write
``N`` gateway-shaped spans (60 prompt ids, 24 sampled ids, logprobs) to their own running rollout while a
reader thread polls ``list_spans`` throughout:

* **baseline**: one transaction (SQL) or one ``POST /api/spans`` (HTTP) per span: the write path before
  the batched writer, still reachable as ``write_batch([span])`` and the single-span route;
* **batched**: ``store.add_span`` as every caller uses it, i.e. through the store's group-commit writer
  (and ``POST /api/batch`` for the HTTP client); each writer waits for each span's commit in turn;
* **pipelined**: each writer hands all its spans to ``store.submit`` at once and then waits for every
  acknowledgement (how a tracer that flushes at the end of a rollout writes); every span is still
  acknowledged only once committed;
* **flushed**: each writer hands all its spans to ``store.submit_many(spans, stored=False)`` (one
  acknowledgement for the lot, resolved once the last of them is committed, with one outcome per span: an
  error or ``None``; how a tracer's flush writes), then checks every span's outcome.

The benchmark process tunes its garbage collector as a serving process does (``agentforge serve`` and the HTTP
store server call :func:`agentforge.config.serving_gc` after start-up: start-up objects frozen, young generation
collected every 50,000 allocations); without it an oldest-generation pass over the whole heap (85-230 ms) fell
into most 128-writer phases. ``--default-gc`` measures with CPython's defaults.

Printed per row: spans/s, the ratio batched/baseline (same writers, same spans, same run), lost (sent but
not stored), duplicates, errors and reader polls. Then the targets of issue 11: ≥ 20,000 spans/s on SQLite
in-process, ≥ 10,000 on PostgreSQL, ≥ 5,000 over HTTP, 0 lost, 0 duplicates, 0 errors.

    python benchmarks/store.py                                   # SQLite, in-process and over HTTP
    python benchmarks/store.py --pg-url postgresql+psycopg://...  # also PostgreSQL (or AGENTFORGE_TEST_PG_URL)
    python benchmarks/store.py --writers 32 --spans 50 --json     # one size; machine-readable last line
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _spine import ChildServer, free_port, llm_span  # noqa: E402

from agentforge.config import serving_gc  # noqa: E402
from agentforge.stores.http import HTTPStore  # noqa: E402
from agentforge.stores.sql import SQLStore  # noqa: E402
from agentforge.types import Rollout, Span, Task  # noqa: E402

TARGETS = {"sqlite": 20_000, "postgres": 10_000, "http-sqlite": 5_000, "http-postgres": 5_000}

_SERVER = """
import sys, uvicorn
from agentforge.stores.sql import SQLStore
from agentforge.stores.server import create_store_app
from agentforge.config import serving_gc
store = SQLStore({url!r})
app = create_store_app(store)
serving_gc()  # what a store server process should do after start-up (see create_store_app)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


@dataclass
class Row:
    """One measured phase."""

    backend: str
    mode: str
    writers: int
    spans: int
    seconds: float
    spans_per_s: float
    lost: int
    duplicates: int
    errors: int
    reader_polls: int
    reader_errors: int


def _rollouts(store: SQLStore | HTTPStore, n: int) -> list[str]:
    """``n`` running rollouts (enqueued and claimed, so spans get their attempt stamped)."""
    agent = f"bench-{uuid.uuid4().hex[:8]}"
    for i in range(n):
        store.enqueue_rollout(Rollout(task=Task(input={"i": i}), agent=agent))
    ids = []
    for _ in range(n):
        claimed = store.claim_rollout("bench", agent=agent)
        assert claimed is not None
        ids.append(claimed[0].rollout_id)
    return ids


def measure(
    store: SQLStore | HTTPStore,
    backend: str,
    mode: str,
    writers: int,
    per_writer: int,
    write: Callable[[Span], object],
    pipelined: bool = False,
    flushed: bool = False,
) -> Row:
    """Run ``writers`` threads × ``per_writer`` spans through ``write`` with a polling reader
    (``pipelined``: ``store.submit`` all of a writer's spans, then wait for each acknowledgement;
    ``flushed``: ``store.submit_many`` them, then check each span's outcome)."""
    rollout_ids = _rollouts(store, writers)
    spans = [[llm_span(rid, i) for i in range(per_writer)] for rid in rollout_ids]
    errors: list[BaseException] = []
    polls, poll_errors, done = [0], [0], threading.Event()

    def writer(batch: list[Span]) -> None:
        if flushed:
            try:
                outcomes = store.submit_many(batch, stored=False).result()  # a flush checks errors only
            except Exception as exc:  # counted and printed, never hidden
                errors.extend([exc] * len(batch))
                return
            errors.extend(o for o in outcomes if isinstance(o, BaseException))
            return
        if pipelined:
            for future in [store.submit(span) for span in batch]:
                try:
                    future.result()
                except Exception as exc:  # counted and printed, never hidden
                    errors.append(exc)
            return
        for span in batch:
            try:
                write(span)
            except Exception as exc:  # counted and printed, never hidden
                errors.append(exc)

    def reader() -> None:
        k = 0
        while not done.is_set():
            try:
                store.list_spans(rollout_id=rollout_ids[k % len(rollout_ids)])
                polls[0] += 1
            except Exception:
                poll_errors[0] += 1
            k += 1
            time.sleep(0.05)

    poller = threading.Thread(target=reader, daemon=True)
    poller.start()
    threads = [threading.Thread(target=writer, args=(b,)) for b in spans]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    done.set()
    poller.join()
    stored = [sp.span_id for rid in rollout_ids for sp in store.list_spans(rollout_id=rid)]
    sent = {sp.span_id for batch in spans for sp in batch}
    if errors:
        print(f"  {backend}/{mode}: {len(errors)} errors, first: {errors[0]!r}", file=sys.stderr)
    total = writers * per_writer
    return Row(
        backend,
        mode,
        writers,
        total,
        round(seconds, 3),
        round(total / seconds, 1),
        lost=len(sent - set(stored)),
        duplicates=len(stored) - len(set(stored)),
        errors=len(errors),
        reader_polls=polls[0],
        reader_errors=poll_errors[0],
    )


def run_backend(
    backend: str, url: str, sizes: list[int], per_writer: int, baseline_writers: int
) -> list[Row]:
    """Baseline and batched phases of one backend (``http-*`` backends: through a child server)."""
    server = None
    if backend.startswith("http"):
        server = ChildServer(_SERVER.format(url=url), free_port(), health="/api/store/health")
        store: SQLStore | HTTPStore = HTTPStore(server.url)
    else:
        store = SQLStore(url)
    rows = []
    try:
        if isinstance(store, HTTPStore):
            http = store

            def single(span: Span) -> object:
                return http._request("POST", "/api/spans", span.model_dump())  # the single-span route
        else:
            sql = store

            def single(span: Span) -> object:
                result = sql.write_batch([span])[0]  # one transaction for this span alone
                if isinstance(result, Exception):
                    raise result
                return result

        rows.append(measure(store, backend, "baseline", baseline_writers, per_writer, single))
        for writers in sizes:
            rows.append(measure(store, backend, "batched", writers, per_writer, store.add_span))
        for writers in sizes:
            rows.append(
                measure(store, backend, "pipelined", writers, per_writer, store.add_span, pipelined=True)
            )
        for writers in sizes:
            rows.append(measure(store, backend, "flushed", writers, per_writer, store.add_span, flushed=True))
    finally:
        store.close()
        if server is not None:
            server.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the phases and print the table; exit status 0 (the targets are reported, not asserted)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--writers", type=int, nargs="+", default=[32, 128], help="writer threads per phase")
    p.add_argument("--spans", type=int, default=50, help="spans per writer")
    p.add_argument("--pg-url", default=os.environ.get("AGENTFORGE_TEST_PG_URL"), help="PostgreSQL URL")
    p.add_argument("--no-http", action="store_true", help="skip the HTTP store phases")
    p.add_argument("--json", action="store_true", help="print the rows as one JSON line at the end")
    p.add_argument("--default-gc", action="store_true", help="keep CPython's GC settings (no serving_gc)")
    args = p.parse_args(argv)
    if not args.default_gc:
        serving_gc()  # what a serving process does after start-up (see the module docstring)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        backends = [("sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}")]
        if args.pg_url:
            backends.append(("postgres", args.pg_url))
        if not args.no_http:
            backends += [(f"http-{name}", url) for name, url in list(backends)]
        for name, url in backends:
            if name.startswith("http"):  # a fresh SQLite file for the server; PostgreSQL is shared
                url = f"sqlite:///{Path(tmp) / 'http.db'}" if "sqlite" in name else url
            rows += run_backend(name, url, args.writers, args.spans, baseline_writers=args.writers[0])
    base = {r.backend: r for r in rows if r.mode == "baseline"}
    print(
        f"\n{'backend':<14}{'mode':<11}{'writers':>8}{'spans':>7}{'spans/s':>10}{'× base':>8}"
        f"{'lost':>6}{'dup':>5}{'err':>5}{'polls':>7}{'target':>9}"
    )
    for r in rows:
        ratio = r.spans_per_s / base[r.backend].spans_per_s
        target = TARGETS.get(r.backend, 0)
        mark = "" if r.mode == "baseline" else ("met" if r.spans_per_s >= target and not r.lost else "MISSED")
        print(
            f"{r.backend:<14}{r.mode:<11}{r.writers:>8}{r.spans:>7}{r.spans_per_s:>10,.0f}{ratio:>7.1f}×"
            f"{r.lost:>6}{r.duplicates:>5}{r.errors:>5}{r.reader_polls:>7}{target:>8,} {mark}"
        )
    if args.json:
        print(json.dumps([asdict(r) for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
