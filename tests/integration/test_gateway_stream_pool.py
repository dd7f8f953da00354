"""No store connection is held across a streamed answer (a public bug elsewhere: a FastAPI ``yield`` session
held for the life of an SSE response exhausted the pool).

Three slow streams (one chunk every 1.5 s) stay open through the gateway on a PostgreSQL store whose pool
has 2 connections and a 2 s pool timeout — and, in the second test, three more through the example app
(``examples/app/service.py``, whose conversations stream through the gateway); meanwhile a plain call
through the gateway and a store query each succeed in less than the pool timeout (a held pool would make
them wait it out and fail), and PostgreSQL shows no session idle in a transaction. The same on SQLite must
not meet "database is locked".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from example_app import load_service
from sqlalchemy import create_engine, text

from agentforge.gateway.server import AppServer, serve_gateway
from agentforge.stores.sql import SQLStore
from agentforge.testing import ScriptedTurn, ScriptedUpstream
from agentforge.types import Rollout, RolloutState

SLOW = ScriptedTurn("one two three four", token_ids=[11, 12, 13, 14], chunk_delay_s=1.5)


def _idle_in_transaction(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'"
            return int(conn.execute(text(sql)).scalar_one())
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def small_pool_store(request: pytest.FixtureRequest, tmp_path) -> Iterator[tuple[SQLStore, str]]:  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'traces.db'}"
        store = SQLStore(url, busy_timeout_s=2.0, max_retries=0)
    else:
        url = request.getfixturevalue("pg_url")
        store = SQLStore(url, pool={"pool_size": 2, "max_overflow": 0, "pool_timeout": 2}, max_retries=0)
    try:
        yield store, url
    finally:
        store.close()


@pytest.mark.slow
def test_streams_hold_no_store_connection(small_pool_store: tuple[SQLStore, str]) -> None:
    store, url = small_pool_store
    upstream = ScriptedUpstream([SLOW, SLOW, SLOW, "fast answer"])
    rollouts = [store.enqueue_rollout(Rollout()) for _ in range(4)]
    with upstream.serve() as engine, serve_gateway(store, upstream.router(base_url=f"{engine.url}/v1")) as gw:
        first_chunk = threading.Barrier(4)
        bodies: list[str] = []
        errors: list[BaseException] = []

        def stream(rollout_id: str) -> None:
            try:
                body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "stream": True}
                with httpx.stream(
                    "POST", f"{gw.rollout_base_url(rollout_id)}/chat/completions", json=body, timeout=60
                ) as r:
                    lines = r.iter_lines()
                    got = [next(lines)]
                    first_chunk.wait(timeout=30)
                    got.extend(lines)
                    bodies.append("\n".join(got))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=stream, args=(r.rollout_id,)) for r in rollouts[:3]]
        for t in threads:
            t.start()
        first_chunk.wait(timeout=30)  # all three streams are open and mid-answer now
        answer = httpx.post(
            f"{gw.rollout_base_url(rollouts[3].rollout_id)}/chat/completions",
            json={"model": "policy", "messages": [{"role": "user", "content": "quick"}]},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "fast answer"
        assert len(store.list_rollouts(state=RolloutState.queued)) == 4  # a store query while streams run
        assert len(store.list_spans(rollout_id=rollouts[3].rollout_id)) == 1
        if url.startswith("postgresql"):
            assert _idle_in_transaction(url) == 0
        for t in threads:
            t.join(timeout=60)
        assert errors == [] and len(bodies) == 3
        assert all("[DONE]" in b for b in bodies)
    for r in rollouts[:3]:
        (span,) = store.list_spans(rollout_id=r.rollout_id)
        assert (
            span.status == "ok" and span.llm is not None and span.llm.completion_token_ids == [11, 12, 13, 14]
        )


@pytest.mark.slow
def test_streams_through_the_example_app_and_the_gateway_hold_no_store_connection(
    small_pool_store: tuple[SQLStore, str],
) -> None:
    store, url = small_pool_store
    service = load_service()
    upstream = ScriptedUpstream([SLOW] * 6 + ["fast answer"])
    rollouts = [store.enqueue_rollout(Rollout()) for _ in range(4)]
    with (
        upstream.serve() as engine,
        serve_gateway(store, upstream.router(base_url=f"{engine.url}/v1")) as gw,
        AppServer(service.create_app(gw.url, store)) as app,
    ):
        started = [httpx.post(f"{app.url}/sessions", json={}, timeout=30).json() for _ in range(3)]
        sessions = [s["session_id"] for s in started]
        owners = {s["session_id"]: {"Authorization": f"Bearer {s['session_token']}"} for s in started}
        opened = threading.Barrier(7)
        errors: list[BaseException] = []
        done: list[str] = []

        def read(url: str, body: dict, headers: dict | None = None) -> None:
            try:
                with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as r:
                    assert r.status_code == 200, r.read()
                    lines = r.iter_lines()
                    got = [next(lines)]
                    opened.wait(timeout=30)
                    got.extend(lines)
                    done.append("\n".join(got))
            except BaseException as exc:
                errors.append(exc)

        chat = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        targets = [(f"{gw.rollout_base_url(r.rollout_id)}/chat/completions", chat) for r in rollouts[:3]]
        targets += [
            (f"{app.url}/sessions/{sid}/messages", {"content": "hi", "stream": True}, owners[sid])
            for sid in sessions
        ]
        threads = [threading.Thread(target=read, args=target) for target in targets]
        for t in threads:
            t.start()
        opened.wait(timeout=30)  # six streams open and mid-answer, three of them inside the app
        t0 = time.monotonic()
        answer = httpx.post(
            f"{gw.rollout_base_url(rollouts[3].rollout_id)}/chat/completions",
            json={"model": "policy", "messages": [{"role": "user", "content": "quick"}]},
            timeout=30,
        )
        call_s = time.monotonic() - t0
        t0 = time.monotonic()
        queued = store.list_rollouts(state=RolloutState.queued)
        query_s = time.monotonic() - t0
        assert (
            answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "fast answer"
        )
        assert len(queued) == 4
        assert call_s < 2.0 and query_s < 2.0, (
            call_s,
            query_s,
        )  # below the pool timeout: nothing waited for it
        if url.startswith("postgresql"):
            assert _idle_in_transaction(url) == 0
        for t in threads:
            t.join(timeout=60)
        assert errors == [] and len(done) == 6
    for sid in sessions:  # each app turn is one recorded, token-exact call of its conversation
        (span,) = store.list_spans(rollout_id=sid)
        assert (
            span.status == "ok" and span.llm is not None and span.llm.completion_token_ids == [11, 12, 13, 14]
        )
