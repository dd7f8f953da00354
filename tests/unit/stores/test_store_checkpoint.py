"""The SQLite store's background WAL checkpointer (agentforge.stores.checkpoint): it runs off the writer's
thread, keeps the WAL bounded under sustained writes, and loses nothing acknowledged when the process is
killed; and the span writer's batched lookups on every SQL backend (PostgreSQL: ``= ANY(array)``)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentforge.stores.checkpoint import WalCheckpointer
from agentforge.stores.sql import SQLStore
from agentforge.types import Rollout, Span, SpanKind, Task


def _spans(n: int, rollout_id: str | None = None) -> list[Span]:
    return [
        Span(rollout_id=rollout_id, kind=SpanKind.llm, name="chat", attributes={"pad": "x" * 900, "i": i})
        for i in range(n)
    ]


def test_connections_leave_checkpoints_to_the_checkpointer(tmp_path: Path) -> None:
    with SQLStore(f"sqlite:///{tmp_path / 'a.db'}") as store:
        assert store._checkpointer is not None
        with store._tx.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
    with SQLStore(f"sqlite:///{tmp_path / 'b.db'}", background_checkpoints=False) as store:
        assert store._checkpointer is None
        with store._tx.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 1000
    with SQLStore("sqlite://") as store:  # in memory: no WAL, no checkpointer
        assert store._checkpointer is None


def test_the_wal_stays_bounded_under_sustained_writes(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    with SQLStore(f"sqlite:///{path}") as store:
        checkpointer = store._checkpointer
        assert checkpointer is not None
        checkpointer.max_wal_pages = 64  # ~256 kB: many times below what the writes below add up to
        # Every batch queued at once: the writer commits back to back, so a background pass never finds the
        # WAL fully copied at the start of the next transaction; only the writer's catch-up restarts it.
        futures = [store.submit_many(_spans(200)) for _ in range(80)]
        outcomes = [o for f in futures for o in f.result(60)]
        assert not [o for o in outcomes if isinstance(o, BaseException)]
        wal_bytes = os.path.getsize(f"{path}-wal")
        assert checkpointer.passes > 0
        # Left to background passes alone it grew past 20 MB here; caught up it stays within a few batches.
        assert wal_bytes < 8 * 2**20, f"WAL grew to {wal_bytes / 2**20:.1f} MB"
        assert len(store.list_spans(orphans=True)) == 16000


def _passes_after(checkpointer: WalCheckpointer, seconds: float, first: int) -> int:
    """The passes run within ``seconds`` beyond the ``first`` already run (polled, so no sleep is longer
    than it must be to see a pass that came)."""
    deadline = time.monotonic() + seconds
    while checkpointer.passes <= first and time.monotonic() < deadline:
        time.sleep(0.01)
    return checkpointer.passes - first


def test_passes_wait_the_interval_unless_enough_rows_were_committed(tmp_path: Path) -> None:
    path = tmp_path / "i.db"
    with sqlite3.connect(path) as conn:  # a WAL database with frames to copy
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x)")
        conn.executemany("INSERT INTO t VALUES (?)", [("x" * 900,)] * 50)
    checkpointer = WalCheckpointer(str(path), interval_s=30.0, pass_rows=500)
    try:
        checkpointer.committed(10)  # the first commit: a pass at once, then a 30 s pause
        assert _passes_after(checkpointer, 10.0, 0) == 1
        checkpointer.committed(10)  # 10 rows during the pause: it goes on, no pass
        assert _passes_after(checkpointer, 0.5, 1) == 0
        checkpointer.committed(490)  # 500 rows since the last pass: the pause ends, the next pass runs
        assert _passes_after(checkpointer, 10.0, 1) == 1
        assert checkpointer.wal_pages > 0
    finally:
        checkpointer.close()  # ends the pause at once
    with pytest.raises(ValueError, match="pass_rows"):
        WalCheckpointer(str(path), pass_rows=0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_checkpoints_with_its_own_thread(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x)")
    checkpointer = WalCheckpointer(str(path), interval_s=30.0, pass_rows=500)
    try:
        checkpointer.committed(400)  # the parent's thread: one pass, then in its 30 s pause
        assert _passes_after(checkpointer, 10.0, 0) == 1
        pid = os.fork()
        if pid == 0:  # the child: the parent's thread, events and counts are not its own
            code = 1
            try:
                checkpointer.committed(200)  # starts a thread of its own, which passes at once
                code = 0 if _passes_after(checkpointer, 10.0, 1) == 1 and checkpointer._rows == 0 else 2
                checkpointer.close()
            finally:
                os._exit(code)
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0, done
        assert checkpointer.passes == 1  # the parent's pause goes on
    finally:
        checkpointer.close()


_CHILD = """
import os, signal, sys
from agentforge.stores.sql import SQLStore
from agentforge.types import Span, SpanKind
store = SQLStore(sys.argv[1])
store._checkpointer.max_wal_pages = 32
for k in range(30):
    batch = [Span(kind=SpanKind.llm, name="chat", attributes={"pad": "x" * 900}) for _ in range(100)]
    outcomes = store.submit_many(batch).result(60)
    assert not [o for o in outcomes if isinstance(o, BaseException)]
    print(*[sp.span_id for sp in batch], flush=True)  # acknowledged: committed
    store.submit_many([Span(kind=SpanKind.llm, name="unacknowledged") for _ in range(50)])
os.kill(os.getpid(), signal.SIGKILL)  # no close(): the checkpointer and the writer die mid-work
"""


def test_a_killed_process_loses_no_acknowledged_span(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'killed.db'}"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CHILD), url], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    acknowledged = proc.stdout.split()
    assert len(acknowledged) == 3000
    with SQLStore(url) as store:
        stored = {sp.span_id for sp in store.list_spans(orphans=True)}
    assert set(acknowledged) <= stored


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_batched_lookups_find_stored_spans_and_running_attempts(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("pg_url") if backend == "postgres" else f"sqlite:///{tmp_path / 'l.db'}"
    with SQLStore(url) as store:
        rollouts = [store.enqueue_rollout(Rollout(task=Task(input={"i": i}), agent="a")) for i in range(3)]
        attempts = {}
        for _ in rollouts:
            claimed = store.claim_rollout("w", agent="a")
            assert claimed is not None
            attempts[claimed[0].rollout_id] = claimed[1].attempt_id
        spans = [sp for r in rollouts for sp in _spans(4, r.rollout_id)]
        first = store.submit_many(spans).result(30)
        assert [s.attempt_id for s in first] == [attempts[s.rollout_id] for s in spans]  # type: ignore[union-attr]
        again = store.submit_many([*spans[:5], *_spans(2, rollouts[0].rollout_id)]).result(30)
        assert [s.sequence for s in again[:5]] == [s.sequence for s in first[:5]]  # type: ignore[union-attr]
        sequences = [s.sequence for s in [*first, *again[5:]]]  # type: ignore[union-attr]
        assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
