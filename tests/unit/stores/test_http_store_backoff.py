"""``HTTPStore`` retries with backoff (tenacity): a store server whose database is unavailable answers 503,
which requests ride out; a retried ``claim_rollout`` (it carries its attempt id) claims once.

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


def test_requests_ride_out_a_503_and_a_retried_claim_claims_once() -> None:
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
        threading.Timer(0.3, backing.up.set).start()
        claimed = client.claim_rollout("w-1")  # it carries its attempt id: retried like any request
        assert claimed is not None and backing.calls > calls + 1
        assert [a.attempt_id for a in backing.list_attempts("ro-1")] == [
            claimed[1].attempt_id
        ]  # claimed once
        backing.up.clear()
        bounded = HTTPStore(url, retries=1000, backoff_s=0.02, max_backoff_s=0.05, retry_for_s=0.3)
        started = time.monotonic()
        with pytest.raises(StoreError, match="database unavailable"):
            bounded.list_rollouts()
        # retry_for_s bounds the retries, not the count (1,000 would take 50 s)
        assert time.monotonic() - started < 20
        client.close()
        bounded.close()
    backing.close()
