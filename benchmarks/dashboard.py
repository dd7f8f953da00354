"""The dashboard's rollouts page over a store with 100,000 rollouts: time to first render, side by side.

Fills a SQLite file (and PostgreSQL with ``--pg-url``) with ``N`` rollouts, each with one gateway-shaped LLM
span and a reward, then times ``GET /rollouts`` of the dashboard app (rendered HTML, through Starlette's test
client, so the figure is the server's work: store query + template):

* **first render**: a freshly built app's first request (templates compiled, caches cold): the target of
  issue 14 is < 1 s;
* **warm**: the median of later requests of the same page;
* **deep page**: the page just before the oldest rollouts (keyset cursor; an ``OFFSET`` query would scan all
  the rows before it);
* **filtered**: reward range + agent, and a version filter;
* **baseline**: what a page cost before ``page_rollouts``: ``list_rollouts()`` of every rollout, then the
  training reward of the 50 newest (how ``agentforge traces list`` reads), in the same process.

    python benchmarks/dashboard.py                      # SQLite, 100,000 rollouts
    python benchmarks/dashboard.py --rollouts 20000 --pg-url postgresql+psycopg://...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _spine import llm_span  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from agentforge.dashboard.app import create_dashboard_app  # noqa: E402
from agentforge.queries import RolloutQuery  # noqa: E402
from agentforge.stores.sql import SQLStore  # noqa: E402
from agentforge.stores.sql_batch import next_seqs  # noqa: E402
from agentforge.stores.tables import (  # noqa: E402
    RewardRow,
    RolloutRow,
    SpanRow,
    reward_to_row,
    rollout_to_row,
    span_values,
)
from agentforge.types import Reward, Rollout, RolloutState  # noqa: E402

TARGET_S = 1.0


def fill(store: SQLStore, n: int, chunk: int = 5000) -> float:
    """``n`` succeeded rollouts (agents a0..a3, versions policy@v1..v4), one LLM span and one final reward each.

    Everything goes in by bulk ``INSERT`` into the store's own tables with store-wide sequence numbers taken
    as the store takes them (``next_seqs``): the queue's one transaction per enqueue, and the late-span check
    a span of a finished rollout gets, would take many minutes at this size and are not what is measured.

    Returns: seconds taken.
    """
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        count = min(n, start + chunk) - start
        rollouts = [
            Rollout(
                rollout_id=f"ro-{i:08d}",
                agent=f"a{i % 4}",
                state=RolloutState.succeeded,
                attempts=1,
                created_at=1.7e9 + i,
                metadata={"trainer_run": f"run-{i // 20000}", "step": i // 64},
            )
            for i in range(start, start + count)
        ]

        def bulk(s, rollouts=rollouts, start=start) -> None:
            rows = []
            for r in rollouts:
                row = rollout_to_row(r).model_dump(exclude={"seq"})
                rows.append({**row, "state": r.state.value})
            s.execute(insert(RolloutRow), rows)
            seqs = iter(next_seqs(s, 2 * len(rollouts)))
            spans, rewards = [], []
            for k, r in enumerate(rollouts):
                span = llm_span(r.rollout_id, start + k)
                span.llm.version = f"policy@v{1 + (start + k) % 4}"
                spans.append(span_values(span, next(seqs)))
                reward = Reward(rollout_id=r.rollout_id, value=((start + k) % 10) / 10, final=True)
                rewards.append(reward_to_row(reward, next(seqs)).model_dump())
            s.execute(insert(SpanRow), spans)
            s.execute(insert(RewardRow), rewards)

        store._tx.run(bulk, write=True)
    return time.perf_counter() - t0


def timed(client: TestClient, url: str) -> float:
    t0 = time.perf_counter()
    resp = client.get(url)
    elapsed = time.perf_counter() - t0
    assert resp.status_code == 200 and "rollout-row" in resp.text, (url, resp.status_code, resp.text[:300])
    return elapsed


def measure(store: SQLStore, label: str, repeats: int) -> dict[str, float]:
    app = create_dashboard_app(store, tokenizer=False)
    client = TestClient(app)
    first = timed(client, "/rollouts")
    warm = statistics.median(timed(client, "/rollouts") for _ in range(repeats))
    last = store.list_rollouts(limit=60)[-1]  # the 60th oldest: the page before it holds the oldest rows
    seq = store.page_rollouts(RolloutQuery(until=last.created_at + 0.5, limit=1)).items[0].cursor
    deep = statistics.median(timed(client, f"/rollouts?before={seq}") for _ in range(repeats))
    filtered = statistics.median(
        timed(client, "/rollouts?agent=a1&min_reward=0.5&max_reward=0.9") for _ in range(repeats)
    )
    version = statistics.median(timed(client, "/rollouts?version=policy%40v2") for _ in range(repeats))
    t0 = time.perf_counter()
    everything = store.list_rollouts()
    for r in everything[-50:]:
        store.final_reward(r.rollout_id)
    baseline = time.perf_counter() - t0
    out = {
        "first_s": first,
        "warm_s": warm,
        "deep_s": deep,
        "filtered_s": filtered,
        "version_s": version,
        "baseline_s": baseline,
    }
    print(
        f"{label:<10} first render {first * 1e3:7.1f} ms  warm {warm * 1e3:6.1f} ms  deep page {deep * 1e3:6.1f} ms  "
        f"reward+agent {filtered * 1e3:6.1f} ms  version {version * 1e3:6.1f} ms  |  baseline (list all + rewards) "
        f"{baseline * 1e3:7.1f} ms = {baseline / warm:5.1f}x the warm page  "
        f"[{'PASS' if first < TARGET_S else 'MISS'} < {TARGET_S:.0f} s]",
        flush=True,
    )
    return out


@contextlib.contextmanager
def _fresh(url: str) -> Iterator[str]:
    """``url`` itself for SQLite; for PostgreSQL a new database beside the given one (the role needs
    ``CREATEDB``, as ``scripts/start_postgres.sh`` makes it), dropped afterwards: other users' data is never
    touched."""
    if not url.startswith("postgresql"):
        yield url
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"agentforge_dashboard_bench_{os.getpid()}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pg-url", default=os.environ.get("AGENTFORGE_BENCH_PG_URL"))
    parser.add_argument("--json", action="store_true", help="print the figures as JSON on the last line")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        backends = [("sqlite", f"sqlite:///{Path(tmp) / 'dashboard.db'}")]
        if args.pg_url:
            backends.append(("postgresql", args.pg_url))
        for label, url in backends:
            with _fresh(url) as fresh, SQLStore(fresh, sqlite_synchronous="NORMAL") as store:
                took = fill(store, args.rollouts)
                print(
                    f"{label:<10} filled {args.rollouts:,} rollouts (+1 span, +1 reward each) in {took:.1f} s"
                )
                results[label] = measure(store, label, args.repeats)
    if args.json:
        print(json.dumps(results))
    return 0 if all(r["first_s"] < TARGET_S for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
