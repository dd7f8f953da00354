"""The store's own retries: a locked SQLite database and an unreachable store server are retried inside
the store; only exhausted retries reach the caller, as ``StoreError`` naming the cause."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from agentforge.errors import StoreError, UserError
from agentforge.stores.http import HTTPStore
from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore
from agentforge.types import Rollout, Span


def _hold_write_lock(path: Path, seconds: float, locked: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    locked.set()
    time.sleep(seconds)
    conn.execute("COMMIT")
    conn.close()


def test_locked_sqlite_is_retried_until_the_lock_is_released(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = SQLStore(f"sqlite:///{path}", busy_timeout_s=0.01)  # every wait becomes a "database is locked"
    locked = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, 0.5, locked))
    holder.start()
    locked.wait(5)
    started = time.monotonic()
    rollout = store.enqueue_rollout(Rollout())  # blocks through retries, then succeeds
    assert time.monotonic() - started >= 0.3
    holder.join()
    assert store.get_rollout(rollout.rollout_id) == rollout
    store.close()


def test_a_flush_serialised_ahead_is_written_once_after_lock_retries(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = SQLStore(f"sqlite:///{path}", busy_timeout_s=0.01)
    spans = [Span(name=f"s{i}", attributes={"i": i}) for i in range(5)]  # serialised in submit_many
    locked = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, 0.5, locked))
    holder.start()
    locked.wait(5)
    outcomes = store.submit_many(spans).result(30)  # the writer's transaction is retried through the lock
    holder.join()
    assert [o.span_id for o in outcomes] == [s.span_id for s in spans]  # type: ignore[union-attr]
    listed = store.list_spans(orphans=True)
    assert listed == outcomes and len({s.sequence for s in listed}) == 5
    store.close()


def test_exhausted_retries_raise_store_error(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = SQLStore(f"sqlite:///{path}", busy_timeout_s=0.01, max_retries=2)
    locked = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, 1.0, locked))
    holder.start()
    locked.wait(5)
    with pytest.raises(StoreError, match="database is locked"):
        store.add_span(Span())
    holder.join()
    assert store.add_span(Span()).sequence is not None  # usable again once the lock is gone
    store.close()


def test_default_url_wal_mode_closed_store_and_bad_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTFORGE_STORE_URL", raising=False)
    monkeypatch.setenv("AGENTFORGE_HOME", str(tmp_path / "home"))
    store = SQLStore()
    assert store.url == f"sqlite:///{tmp_path / 'home' / 'traces.db'}"
    store.enqueue_rollout(Rollout())
    with sqlite3.connect(tmp_path / "home" / "traces.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    store.close()
    with pytest.raises(UserError, match="closed"):
        store.list_rollouts()
    with pytest.raises(UserError, match="unsupported store URL") as info:
        SQLStore("mysql://u:secret@host/db")
    assert "secret" not in str(info.value)
    with pytest.raises(UserError, match="sqlite_synchronous"):
        SQLStore(f"sqlite:///{tmp_path / 'x.db'}", sqlite_synchronous="OFF")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_store_unreachable_raises_store_error_with_url() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    client = HTTPStore(url, retries=2, backoff_s=0.01)
    with pytest.raises(StoreError, match=f"{url}/api/rollouts unreachable after 3 tries"):
        client.list_rollouts()
    client.close()


def test_http_store_retries_until_the_server_is_up(tmp_path: Path) -> None:
    import uvicorn

    backing = SQLStore(f"sqlite:///{tmp_path / 't.db'}")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening yet: connections are refused
    server = uvicorn.Server(uvicorn.Config(create_store_app(backing), log_level="warning", lifespan="off"))

    def start_late() -> None:
        time.sleep(0.3)
        server.run(sockets=[sock])

    thread = threading.Thread(target=start_late, daemon=True)
    thread.start()
    client = HTTPStore(f"http://127.0.0.1:{sock.getsockname()[1]}", retries=6, backoff_s=0.05)
    try:
        assert client.enqueue_rollout(Rollout(rollout_id="ro-1")).rollout_id == "ro-1"
        assert backing.get_rollout("ro-1").rollout_id == "ro-1"
    finally:
        client.close()
        server.should_exit = True
        thread.join(10)
        sock.close()
        backing.close()
