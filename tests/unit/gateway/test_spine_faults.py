"""Faults on the spine found by an adversarial review: each test fails on the code before its fix."""

from __future__ import annotations

import time

import httpx
from gateway_helpers import RawEngine, sse_chunk
from starlette.applications import Starlette
from starlette.routing import Mount

from agentforge.gateway.app import create_gateway
from agentforge.gateway.server import AppServer, serve_gateway
from agentforge.stores.sql import SQLStore
from agentforge.testing import ScriptedUpstream, memory_store
from agentforge.types import Reward, Rollout, Span

CHAT = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
KEY = "gateway-key-0123456789"  # at least MIN_KEY_LENGTH characters


class _Unserialisable:
    pass


def test_one_unserialisable_item_fails_alone_not_its_batch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with SQLStore(f"sqlite:///{tmp_path / 't.db'}") as store:
        ro = store.enqueue_rollout(Rollout())
        good = [Span(rollout_id=ro.rollout_id, name=f"g{i}") for i in range(50)]
        bad_span = Span(rollout_id=ro.rollout_id, attributes={"obj": _Unserialisable()})
        bad_reward = Reward(rollout_id=ro.rollout_id, value=1.0, metadata={"obj": _Unserialisable()})
        results = store.write_batch([*good[:25], bad_span, bad_reward, *good[25:]])
        assert [type(r).__name__ for r in results[25:27]] == ["UserError", "UserError"]
        assert "cannot be stored as JSON" in str(results[25])
        assert len(store.list_spans(rollout_id=ro.rollout_id)) == 50
        futures = [store.submit(s) for s in [bad_span, *(Span(rollout_id=ro.rollout_id) for _ in range(20))]]
        errors = [f.exception(timeout=30) for f in futures]
        assert errors[0] is not None and all(e is None for e in errors[1:])


def test_an_engine_that_holds_the_stream_open_after_done_does_not_hold_the_client() -> None:
    store = memory_store()
    chunk = sse_chunk({"content": "hi"}, [5], finish_reason="stop")
    with RawEngine([chunk, "[DONE]"], hold=True) as engine, serve_gateway(store, engine.router) as gw:
        t0 = time.monotonic()
        r = httpx.post(f"{gw.openai_base_url}/chat/completions", json={**CHAT, "stream": True}, timeout=20)
        waited = time.monotonic() - t0
    router = engine.router
    assert r.text.rstrip().endswith("data: [DONE]") and waited < 10  # not the engine's read timeout
    (span,) = store.list_spans(orphans=True)
    assert span.status == "ok" and router.inflight("policy@v1") == 0


def test_a_mounted_gateway_still_checks_the_key_on_llm_routes_and_not_on_health() -> None:
    upstream = ScriptedUpstream(["x"], cycle=True)
    gateway = create_gateway(memory_store(), upstream.router(), api_key=KEY, transport=upstream.transport())
    with AppServer(Starlette(routes=[Mount("/api", app=gateway), Mount("/gw", app=gateway)])) as parent:
        for prefix in ("/api", "/gw"):
            plain = httpx.post(f"{parent.url}{prefix}/v1/chat/completions", json=CHAT, timeout=10)
            keyed = httpx.post(
                f"{parent.url}{prefix}/v1/chat/completions",
                json=CHAT,
                timeout=10,
                headers={"Authorization": f"Bearer {KEY}"},
            )
            assert plain.status_code == 401 and keyed.status_code == 200, (prefix, plain.text)
            assert httpx.get(f"{parent.url}{prefix}/health", timeout=10).status_code == 200
    assert upstream.served == 2


def test_deeply_nested_json_is_a_400_not_a_500() -> None:
    upstream = ScriptedUpstream(["x"], cycle=True)
    store = memory_store()
    with upstream.serve() as engine, serve_gateway(store, upstream.router(base_url=f"{engine.url}/v1")) as gw:
        body = b'{"model": "policy", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        r = httpx.post(f"{gw.openai_base_url}/chat/completions", content=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
