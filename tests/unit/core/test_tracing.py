"""``emit_reward`` / ``emit_span`` from agent code: in process (context, threads, asyncio tasks), with an
explicit store, and over HTTP from another process."""

from __future__ import annotations

import asyncio
import contextvars
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fixtures_store import serve_app

from agentforge.errors import NotFoundError, UserError
from agentforge.stores.server import create_store_app
from agentforge.stores.sql import SQLStore
from agentforge.tracing import current_context, emit_reward, emit_span, rollout_context
from agentforge.types import Rollout, SpanKind


@pytest.fixture
def mem_store() -> Iterator[SQLStore]:
    with SQLStore("sqlite://") as s:
        yield s


def _claimed(store: SQLStore) -> tuple[str, str]:
    store.enqueue_rollout(Rollout())
    got = store.claim_rollout("w")
    assert got is not None
    return got[0].rollout_id, got[1].attempt_id


def test_without_context_raises_a_helpful_user_error(mem_store: SQLStore) -> None:
    assert current_context() is None
    with pytest.raises(UserError, match="rollout_context") as info:
        emit_reward(1.0)
    assert "rollout_id=" in str(info.value) and "url=" in str(info.value)
    with pytest.raises(UserError, match="rollout_context"):
        emit_span("retrieve")
    with pytest.raises(UserError, match="nowhere to write"):
        emit_reward(1.0, rollout_id="ro-x")
    with pytest.raises(UserError, match="not both"):
        emit_reward(1.0, rollout_id="ro-x", store=mem_store, url="http://127.0.0.1:1")


def test_in_context_span_then_reward(mem_store: SQLStore) -> None:
    rollout_id, attempt_id = _claimed(mem_store)
    with rollout_context(mem_store, rollout_id, attempt_id) as ctx:
        assert current_context() is ctx
        span = emit_span("retrieve", {"docs": ["α", "中"]}, kind="tool")
        reward = emit_reward(0.75, name="correct", final=True, judge="exact-match")
    assert current_context() is None
    assert (span.rollout_id, span.attempt_id, span.kind) == (rollout_id, attempt_id, SpanKind.tool)
    assert reward.span_id == span.span_id and reward.metadata == {"judge": "exact-match"}
    stored = mem_store.final_reward(rollout_id)
    assert stored is not None and stored.value == 0.75 and stored.final and stored.name == "correct"
    assert mem_store.list_spans(rollout_id=rollout_id)[0].attributes == {"docs": ["α", "中"]}
    with rollout_context(mem_store, rollout_id), pytest.raises(UserError, match="kind"):
        emit_span("x", kind="nonsense")


def test_contexts_nest_and_unknown_rollout_is_not_found(mem_store: SQLStore) -> None:
    outer, _ = _claimed(mem_store)
    inner, _ = _claimed(mem_store)
    with rollout_context(mem_store, outer):
        with rollout_context(mem_store, inner):
            assert emit_reward(1.0).rollout_id == inner
        assert emit_reward(0.0).rollout_id == outer
        assert emit_reward(0.5, rollout_id=inner).rollout_id == inner  # explicit id, context's store
    with rollout_context(mem_store, "ro-unknown"), pytest.raises(NotFoundError):
        emit_reward(1.0)


def test_context_follows_copy_context_threads(mem_store: SQLStore) -> None:
    rollout_id, attempt_id = _claimed(mem_store)
    with rollout_context(mem_store, rollout_id, attempt_id):
        ctx = contextvars.copy_context()
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(ctx.copy().run, emit_reward, float(i), name=f"t{i}") for i in range(4)]
            rewards = [f.result() for f in futures]
        plain_errors: list[BaseException] = []

        def plain_thread() -> None:  # a bare thread does not inherit the context: clear error, no write
            try:
                emit_reward(9.0)
            except UserError as exc:
                plain_errors.append(exc)

        t = threading.Thread(target=plain_thread)
        t.start()
        t.join()
    assert all(r.rollout_id == rollout_id and r.attempt_id == attempt_id for r in rewards)
    assert sorted(r.value for r in mem_store.list_rewards(rollout_id)) == [0.0, 1.0, 2.0, 3.0]
    assert len(plain_errors) == 1


def test_context_follows_asyncio_tasks_without_leaking(mem_store: SQLStore) -> None:
    a, _ = _claimed(mem_store)
    b, _ = _claimed(mem_store)

    async def agent(rollout_id: str, value: float) -> None:
        async with rollout_context(mem_store, rollout_id):

            async def node() -> None:
                await asyncio.sleep(0.01)  # interleave with the other rollout
                emit_span("node")
                emit_reward(value)

            await asyncio.gather(asyncio.create_task(node()), asyncio.create_task(node()))

    async def main() -> None:
        await asyncio.gather(agent(a, 1.0), agent(b, 0.0))

    asyncio.run(main())
    assert [r.value for r in mem_store.list_rewards(a)] == [1.0, 1.0]
    assert [r.value for r in mem_store.list_rewards(b)] == [0.0, 0.0]
    assert len(mem_store.list_spans(rollout_id=a)) == len(mem_store.list_spans(rollout_id=b)) == 2


def test_explicit_store_without_context(mem_store: SQLStore) -> None:
    rollout_id, attempt_id = _claimed(mem_store)
    span = emit_span("judge", {"score": None}, rollout_id=rollout_id, store=mem_store)
    reward = emit_reward(None, rollout_id=rollout_id, store=mem_store, source="judge")
    assert span.attempt_id == attempt_id  # stamped with the running attempt by the store
    assert reward.span_id == span.span_id and not reward.valid and reward.source == "judge"


def test_over_http_from_another_process(tmp_path: Path) -> None:
    with (
        SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as store,
        serve_app(create_store_app(store, api_key="s3cret-store-key-0123")) as url,
    ):
        rollout_id, _ = _claimed(store)
        store.finish_attempt(store.list_attempts(rollout_id)[0].attempt_id, "succeeded")
        script = textwrap.dedent(f"""
            from agentforge.errors import UserError
            from agentforge.tracing import emit_reward, emit_span
            span = emit_span("feedback-form", {{"text": "great 👍 “thanks”"}}, rollout_id={rollout_id!r},
                             url={url!r}, api_key="s3cret-store-key-0123")
            r = emit_reward(1.0, name="thumbs", final=True, rollout_id={rollout_id!r}, url={url!r},
                            api_key="s3cret-store-key-0123", source="user", comment="👩‍👩‍👧")
            assert r.span_id == span.span_id, (r, span)
            try:
                emit_reward(0.0, rollout_id={rollout_id!r}, url={url!r}, api_key="wrong")
            except UserError as exc:
                assert "api_key" in str(exc), exc
            else:
                raise SystemExit("a wrong API key was accepted")
            print("ok")
        """)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "ok"
        final = store.final_reward(rollout_id)
        assert final is not None and (final.value, final.name, final.source) == (1.0, "thumbs", "user")
        assert final.metadata == {"comment": "👩‍👩‍👧"}
        assert [s.attributes for s in store.list_spans(rollout_id=rollout_id)] == [
            {"text": "great 👍 “thanks”"}
        ]
        assert len(store.list_rewards(rollout_id)) == 1  # the rejected one was not stored
