"""Abandoned calls (issue 36, a contract from public bug reports elsewhere): a client that leaves — mid-stream,
before the first token, or a non-streamed call it stops waiting for — gets the engine request aborted (the
scripted engine records its own abort, as vLLM aborts a request whose client left), and the span keeps the
tokens already sampled (with their logprobs), usage asked or not. On the token-in continuation path (a rollout's
follow-up call, sent to the engine's ``/v1/completions`` as ids, non-streamed whatever the client asked) the
scripted engine renders its fake chat template on ``/tokenize``."""

from __future__ import annotations

import itertools
import time

import httpx
import pytest
from gateway_helpers import give_up_after

from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.gateway.server import GatewayServer
from agentforge.testing import ScriptedTurn, ScriptedUpstream, memory_store
from agentforge.types import Rollout, Span

WORDS = "a b c d e f g h i j k l m n o p"
MESSAGES = [{"role": "user", "content": "Count, please."}]


def _span(store, rollout_id: str, count: int) -> Span:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        spans = [s for s in store.list_spans(rollout_id=rollout_id) if s.llm is not None]
        if len(spans) == count:
            return spans[-1]
        time.sleep(0.02)
    raise AssertionError(f"{count} spans were not recorded")


def _wait_abort(engine: ScriptedUpstream, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(engine.aborted) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(engine.aborted) == count, engine.aborted


@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("where", ["mid-stream", "before the first token"])
def test_a_client_leaving_a_stream_aborts_the_engine_request_and_keeps_the_sampled_tokens(
    where: str, usage: bool
) -> None:
    store = memory_store()
    slow = ScriptedTurn(WORDS, chunk_delay_s=0.2, delay_s=5.0 if where == "before the first token" else 0.0)
    engine = ScriptedUpstream([slow])
    with (
        engine.serve() as served,
        GatewayServer(store, engine.router(base_url=f"{served.url}/v1")) as gateway,
    ):
        rollout_id = store.enqueue_rollout(Rollout()).rollout_id
        url = f"{gateway.rollout_base_url(rollout_id)}/chat/completions"
        body: dict = {"model": "policy", "messages": MESSAGES, "stream": True}
        if usage:
            body["stream_options"] = {"include_usage": True}
        if where == "before the first token":  # the client gives up while the engine has sampled nothing
            with pytest.raises(httpx.ReadTimeout), httpx.Client(timeout=give_up_after(0.5)) as client:
                client.post(url, json=body)
        else:
            with httpx.Client(timeout=30) as client, client.stream("POST", url, json=body) as answer:
                assert answer.status_code == 200, answer.read()
                events = (line for line in answer.iter_lines() if line.startswith("data:"))
                assert len(list(itertools.islice(events, 2))) == 2  # the role, then the first token
                time.sleep(0.5)  # a few more tokens are sampled, then the client hangs up
        _wait_abort(engine, 1)
        span = _span(store, rollout_id, 1)
    number, sent = engine.aborted[0]
    assert number == 1
    assert span.llm is not None and span.attributes.get("client_disconnected") is True, span.attributes
    assert "client_disconnected" in span.llm.flags and not span.llm.trainable
    sampled = slow.completion_ids()
    got = span.llm.completion_token_ids
    if where == "before the first token":
        assert sent == 0 and not got
    else:
        assert 1 <= len(got) < len(sampled) and got == sampled[: len(got)], (got, sampled, sent)
        assert len(span.llm.logprobs) == len(got)


def test_a_non_streamed_call_the_client_stops_waiting_for_aborts_the_engine_request() -> None:
    store = memory_store()
    engine = ScriptedUpstream([ScriptedTurn(WORDS, delay_s=5.0)])
    with (
        engine.serve() as served,
        GatewayServer(store, engine.router(base_url=f"{served.url}/v1")) as gateway,
    ):
        rollout_id = store.enqueue_rollout(Rollout()).rollout_id
        url = f"{gateway.rollout_base_url(rollout_id)}/chat/completions"
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json={"model": "policy", "messages": MESSAGES}, timeout=give_up_after(0.5))
        _wait_abort(engine, 1)
        span = _span(store, rollout_id, 1)
    assert engine.aborted == [(1, 0)]
    assert span.llm is not None and not span.llm.trainable and not span.llm.completion_token_ids
    assert span.attributes.get("client_disconnected") is True, span.attributes


def test_a_client_gone_before_the_call_began_cancels_it_at_once() -> None:
    """The race behind a flaky abort: the connection was lost after the request's head arrived but before the
    call put its watch on the gateway server's disconnect hook. The protocol leaves ``CLIENT_GONE`` there, and
    the watch cancels the call at once instead of waiting for a disconnect that already happened."""
    import asyncio

    from agentforge.gateway.fastpath import CLIENT_GONE, DISCONNECT_HOOK, _Watch

    async def run() -> tuple[bool, bool, object]:
        task = asyncio.ensure_future(asyncio.sleep(30))
        scope = {DISCONNECT_HOOK: CLIENT_GONE}
        watch = _Watch(scope, None, task)  # type: ignore[arg-type]
        try:
            await task
        except asyncio.CancelledError:
            pass
        return task.cancelled(), watch.client_left(), scope[DISCONNECT_HOOK]

    cancelled, left, hook = asyncio.run(run())
    assert cancelled and left and hook is None


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_leaving_a_token_in_continuation_aborts_the_engine_request(stream: bool) -> None:
    """Turn 2 of a conversation continues turn 1 token-in; its client gives up while the engine is still
    generating: the engine request is aborted and the span is the continuation's, flagged as the client's."""
    store = memory_store()
    engine = ScriptedUpstream(["Which city?", ScriptedTurn(WORDS, delay_s=5.0)])
    with engine.serve() as served:
        router = ModelRouter()
        router.register("policy@v1", Upstream(f"{served.url}/v1", "base", token_in=True))
        router.set_alias("policy", "policy@v1")
        with GatewayServer(store, router) as gateway:
            rollout_id = store.enqueue_rollout(Rollout()).rollout_id
            url = f"{gateway.rollout_base_url(rollout_id)}/chat/completions"
            first = httpx.post(url, json={"model": "policy", "messages": MESSAGES}, timeout=30)
            assert first.status_code == 200, first.text
            said = first.json()["choices"][0]["message"]
            follow = [*MESSAGES, {"role": "assistant", "content": said["content"]}]
            follow.append({"role": "user", "content": "Paris."})
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(
                    url,
                    json={"model": "policy", "messages": follow, "stream": stream},
                    timeout=give_up_after(0.5),
                )
            _wait_abort(engine, 1)
            span = _span(store, rollout_id, 2)
    assert engine.aborted == [(2, 0)]
    assert engine.requests[-1].path == "/v1/completions", span.llm.flags  # the continuation went token-in
    assert span.llm is not None and "token_in_continuation" in span.llm.flags, span.llm
    assert "client_disconnected" in span.llm.flags and not span.llm.trainable
    assert span.attributes.get("client_disconnected") is True and not span.llm.completion_token_ids
