"""``HTTPStore`` retries with backoff (tenacity): a store server whose database is unavailable answers 503,
which requests safe to repeat ride out; ``claim_rollout`` (not safe once the server saw it) does not repeat.

Real components: ``create_store_app`` under uvicorn over a store whose database is switched off and on.
"""

from __future__ import annotations

import threading
import time

import pytest
from fixtures_store import serve_app

from agentforge.errors import StoreError
from agentforge.stores.http import HTTPStore
from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore
from agentforge.types import Rollout


class FlakyDatabase(SQLStore):
    """A SQL store whose database is "down" (every call raises ``StoreError``) until :attr:`up` is set."""

    def __init__(self) -> None:
        super().__init__("sqlite://")
        self.up = threading.Event()
        self.calls = 0

    def _gate(self) -> None:
        self.calls += 1
        if not self.up.is_set():
            raise StoreError("database unavailable (test)")

    def list_rollouts(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._gate()
        return super().list_rollouts(*args, **kwargs)

    def claim_rollout(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._gate()
        return super().claim_rollout(*args, **kwargs)


def test_safe_requests_ride_out_a_503_and_claims_do_not_repeat() -> None:
    backing = FlakyDatabase()
    backing.enqueue_rollout(Rollout(rollout_id="ro-1"))
    with serve_app(create_store_app(backing)) as url:
        client = HTTPStore(url, retries=50, backoff_s=0.02, max_backoff_s=0.1, retry_for_s=20)
        threading.Timer(0.5, backing.up.set).start()  # the database comes back after 0.5 s
        started = time.monotonic()
        assert [r.rollout_id for r in client.list_rollouts()] == [
            "ro-1"
        ]  # retried until the database was back
        assert time.monotonic() - started >= 0.4 and backing.calls > 2
        backing.up.clear()
        calls = backing.calls
        with pytest.raises(StoreError, match="database unavailable"):
            client.claim_rollout("w-1")
        assert backing.calls == calls + 1  # one try: a repeated claim could take a second rollout
        bounded = HTTPStore(url, retries=1000, backoff_s=0.02, max_backoff_s=0.05, retry_for_s=0.3)
        started = time.monotonic()
        with pytest.raises(StoreError, match="database unavailable"):
            bounded.list_rollouts()
        assert time.monotonic() - started < 5  # retry_for_s bounds the retries, not the count
        client.close()
        bounded.close()
    backing.close()
