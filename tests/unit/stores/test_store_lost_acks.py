"""Lost acknowledgements (issue 36, a contract from public bug reports elsewhere): a proxy between ``HTTPStore``
and a real store server drops the first answer of every route after the server has acted on the request. Every
record and attempt still exists exactly once: writes carry their ids, and a claim carries the id of the attempt
it opens, so the retried claim returns the same attempt instead of claiming a second rollout."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from fixtures_store import serve_app

from agentforge.errors import StoreError
from agentforge.stores.http import HTTPStore
from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore
from agentforge.types import AttemptState, ResourceVersion, Reward, Rollout, RolloutState, Span

KEY, ADMIN = "lost-acks-store-key-0123", "lost-acks-admin-key-0123"


class DropFirstAnswer(httpx.BaseTransport):
    """Forwards each request; the first answer of each route (ids folded) is read and thrown away, and the
    client sees a broken connection instead: the server acted, the client does not know."""

    def __init__(self) -> None:
        self.inner, self.dropped = httpx.HTTPTransport(), set[str]()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        route = f"{request.method} {re.sub(r'/[a-z]{2}-[0-9a-f-]+', '/{id}', request.url.path)}"
        if route not in self.dropped:
            self.dropped.add(route)
            response.read()
            response.close()
            raise httpx.ReadError("the answer was lost", request=request)
        return response


@pytest.fixture
def served(tmp_path: Path):
    with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as store:
        with serve_app(create_store_app(store, api_key=KEY, admin_key=ADMIN)) as url:
            yield store, url


def test_every_record_and_attempt_exists_once_when_answers_are_lost(served) -> None:
    store, url = served
    proxy = DropFirstAnswer()
    with HTTPStore(url, KEY, admin_key=ADMIN, transport=proxy, retries=3, backoff_s=0.01) as client:
        first = client.enqueue_rollout(Rollout())
        second = client.enqueue_rollout(Rollout())
        rollout, attempt = client.claim_rollout(
            "w-1"
        )  # its answer is lost once: retried with the same attempt id
        assert rollout.rollout_id == first.rollout_id
        client.heartbeat(attempt.attempt_id)
        client.add_span(Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id))
        client.add_reward(Reward(rollout_id=rollout.rollout_id, value=0.5))
        client.write_batch(
            [Span(rollout_id=rollout.rollout_id), Reward(rollout_id=rollout.rollout_id, value=1.0)]
        )
        done = client.finish_attempt(attempt.attempt_id, AttemptState.succeeded)
        assert done.state is RolloutState.succeeded
        with pytest.raises(StoreError):  # a version has no id of its own: publish is never resent blindly
            client.publish_resource(ResourceVersion(name="policy", kind="other", payload={"x": 1}))
        assert [v.version for v in store.list_resources("policy")] == [1]  # the server published it once
        assert client.activate_resource("policy", 1).active
        again = client.claim_rollout("w-1")
        assert again is not None and again[0].rollout_id == second.rollout_id
    assert {"POST /api/rollouts/claim", "POST /api/batch", "POST /api/resources/activate"} <= proxy.dropped
    assert [r.rollout_id for r in store.list_rollouts()] == [first.rollout_id, second.rollout_id]
    assert [a.attempt_id for a in store.list_attempts(first.rollout_id)] == [attempt.attempt_id]
    assert len(store.list_attempts(second.rollout_id)) == 1
    assert len(store.list_spans(rollout_id=first.rollout_id)) == 2
    assert sorted(r.value for r in store.list_rewards(first.rollout_id)) == [0.5, 1.0]


def test_a_claim_replayed_by_another_worker_is_refused(served) -> None:
    store, _ = served
    store.enqueue_rollout(Rollout())
    _, attempt = store.claim_rollout("w-1", attempt_id="at-0123456789abcdef")
    assert store.claim_rollout("w-1", attempt_id=attempt.attempt_id)[1] == attempt
    with pytest.raises(Exception, match="another worker"):
        store.claim_rollout("w-2", attempt_id=attempt.attempt_id)
