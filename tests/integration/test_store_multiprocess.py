"""Many processes on one store: 4 writer processes (spawned) add 250 spans + 250 rewards each to the
same SQLite file (and PostgreSQL database, when configured) while a reader process lists them.

Nothing may be lost or duplicated, sequence numbers must be unique, every reward must attach to a span
recorded before it, and no "database is locked" (or any other error) may reach a caller.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from pathlib import Path

import pytest

from agentforge.stores.sql import SQLStore
from agentforge.types import Reward, Rollout, Span

WRITERS = 4
PER_WRITER = 250


def _writer(url: str, rollout_id: str, n: int, start: object, errors: object) -> None:
    try:
        store = SQLStore(url)
        start.wait(30)  # type: ignore[attr-defined]
        for i in range(PER_WRITER):
            store.add_span(
                Span(span_id=f"sp-w{n}-{i}", rollout_id=rollout_id, name=f"w{n}", attributes={"i": i})
            )
            store.add_reward(Reward(reward_id=f"rw-w{n}-{i}", rollout_id=rollout_id, value=i / PER_WRITER))
        store.close()
    except BaseException:  # noqa: BLE001 - the parent asserts there were none
        errors.put(traceback.format_exc())  # type: ignore[attr-defined]


def _reader(url: str, rollout_id: str, start: object, done: object, errors: object) -> None:
    try:
        store = SQLStore(url)
        start.wait(30)  # type: ignore[attr-defined]
        seen = 0
        while not done.is_set():  # type: ignore[attr-defined]
            spans = store.list_spans(rollout_id=rollout_id)
            seqs = [s.sequence for s in spans]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "spans out of order or duplicated"
            assert len(spans) >= seen, f"span count went down: {seen} -> {len(spans)}"
            seen = len(spans)
            store.list_rewards(rollout_id)
            time.sleep(0.02)  # read often, but leave the CPUs to the writers
        store.close()
    except BaseException:  # noqa: BLE001
        errors.put(traceback.format_exc())  # type: ignore[attr-defined]


def _run_processes(url: str) -> None:
    store = SQLStore(url)
    rollout = store.enqueue_rollout(Rollout())
    ctx = mp.get_context("spawn")
    start, done, errors = ctx.Barrier(WRITERS + 2), ctx.Event(), ctx.Queue()
    writers = [
        ctx.Process(target=_writer, args=(url, rollout.rollout_id, n, start, errors)) for n in range(WRITERS)
    ]
    reader = ctx.Process(target=_reader, args=(url, rollout.rollout_id, start, done, errors))
    for p in [*writers, reader]:
        p.start()
    start.wait(60)
    for p in writers:
        p.join(120)
    done.set()
    reader.join(60)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert failures == [], "\n".join(failures)
    assert [p.exitcode for p in [*writers, reader]] == [0] * (WRITERS + 1)

    spans = store.list_spans(rollout_id=rollout.rollout_id)
    rewards = store.list_rewards(rollout.rollout_id)
    store.close()
    expected_spans = {f"sp-w{n}-{i}" for n in range(WRITERS) for i in range(PER_WRITER)}
    assert len(spans) == WRITERS * PER_WRITER and {s.span_id for s in spans} == expected_spans
    assert len(rewards) == WRITERS * PER_WRITER and len({r.reward_id for r in rewards}) == len(rewards)
    seqs = [s.sequence for s in spans] + [r.sequence for r in rewards]
    assert len(set(seqs)) == len(seqs), "a sequence number was handed out twice"
    span_seq = {s.span_id: s.sequence for s in spans}
    for r in rewards:
        assert r.span_id in span_seq and span_seq[r.span_id] < r.sequence  # type: ignore[operator]
    for n in range(WRITERS):  # each writer's own spans keep its order
        own = [s.attributes["i"] for s in spans if s.name == f"w{n}"]
        assert own == list(range(PER_WRITER))


@pytest.mark.slow
def test_four_writer_processes_on_one_sqlite_file(tmp_path: Path) -> None:
    _run_processes(f"sqlite:///{tmp_path / 'shared.db'}")


@pytest.mark.slow
@pytest.mark.postgres
def test_four_writer_processes_on_postgres(pg_url: str) -> None:
    _run_processes(pg_url)
