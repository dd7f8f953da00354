"""The gateway app against the scripted upstream: handed cases, attribution, errors, admin routes, auth."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from gateway_helpers import CHAT, parse_sse, streamed_arguments

from agentforge.errors import UserError
from agentforge.gateway import GatewayServer, tool_error_messages
from agentforge.gateway.app import create_gateway
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.testing import ScriptedError, ScriptedToolCall, ScriptedTurn, fake_token_ids
from agentforge.types import Reward, Rollout


def only_span(store, **kw):
    spans = store.list_spans(**kw)
    assert len(spans) == 1, spans
    return spans[0]


# --- handed case 1 -------------------------------------------------------------------------------
async def test_streamed_ids_fewer_than_usage_are_flagged_not_trainable(
    make_gateway, gw_client_for, gw_store
) -> None:
    call = ScriptedToolCall("get_time", '{"tz": "UTC"}', token_ids=[901, 902, 903, 904])
    turn = ScriptedTurn(text="Let me check.", tool_calls=[call], swallow_tool_call_ids=True)
    app, upstream = make_gateway([turn])
    r = await gw_client_for(app).post("/v1/chat/completions", json={**CHAT, "stream": True})
    chunks = parse_sse(r.text)
    assert streamed_arguments(chunks) == {0: '{"tz": "UTC"}'}
    llm = only_span(gw_store, orphans=True).llm
    assert llm.completion_token_ids == turn.text_ids() + [902, 903, 904]  # exactly what the stream carried
    assert llm.usage["completion_tokens"] == len(turn.completion_ids())
    assert llm.trainable is False and "token_ids_missing" in llm.flags


# --- handed case 2 (in-process; the SDK clients are in test_gateway_sdk.py) ------------------------
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_streamed_and_unary_calls_record_identical_spans(
    make_gateway, gw_client_for, gw_store, endpoint
) -> None:
    turn = ScriptedTurn("The time is noon.")
    app, _ = make_gateway([turn, turn])
    client = gw_client_for(app)
    path, body = (
        ("/v1/chat/completions", CHAT)
        if endpoint == "chat"
        else ("/v1/completions", {"model": "policy", "prompt": "Time:"})
    )
    unary = await client.post(path, json=body)
    streamed = await client.post(path, json={**body, "stream": True})
    assert unary.status_code == streamed.status_code == 200
    parse_sse(streamed.text)
    a, b = gw_store.list_spans(orphans=True)
    assert (a.llm.stream, b.llm.stream) == (False, True)
    for field in (
        "prompt_token_ids",
        "completion_token_ids",
        "logprobs",
        "usage",
        "finish_reason",
        "response_text",
    ):
        assert getattr(a.llm, field) == getattr(b.llm, field), field
    assert a.llm.completion_token_ids == turn.completion_ids() and len(a.llm.logprobs) == len(
        turn.completion_ids()
    )
    assert a.llm.trainable and b.llm.trainable


async def test_client_gets_ids_and_logprobs_only_when_it_asked(
    make_gateway, gw_client_for, upstream_turns=2
) -> None:
    app, upstream = make_gateway(["Hi there", "Hi there"])
    client = gw_client_for(app)
    plain = (await client.post("/v1/chat/completions", json=CHAT)).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    assert plain["choices"][0]["logprobs"] is None and plain["model"] == "policy@v1"
    full = (
        await client.post("/v1/chat/completions", json={**CHAT, "logprobs": True, "return_token_ids": True})
    ).json()
    assert full["choices"][0]["token_ids"] == fake_token_ids("Hi there")
    assert len(full["choices"][0]["logprobs"]["content"]) == len(full["choices"][0]["token_ids"])
    sent = upstream.requests[0].body
    assert sent["logprobs"] is True and sent["return_token_ids"] is True and sent["model"] == "base"


async def test_stream_without_include_usage_gets_no_usage_chunk(
    make_gateway, gw_client_for, gw_store
) -> None:
    app, upstream = make_gateway(["Hi there"])
    chunks = parse_sse(
        (await gw_client_for(app).post("/v1/chat/completions", json={**CHAT, "stream": True})).text
    )
    assert all(c["choices"] for c in chunks) and all("usage" not in c for c in chunks)
    assert upstream.requests[0].body["stream_options"] == {"include_usage": True}
    assert only_span(gw_store, orphans=True).llm.usage["completion_tokens"] == 2


# --- handed case 3 ---------------------------------------------------------------------------------
async def test_non_canonical_split_is_recorded_verbatim(make_gateway, gw_client_for, gw_store) -> None:
    text = "Hello"
    odd = ScriptedTurn(text, token_ids=[7001, 7002, 7003], pieces=["He", "l", "lo"])
    assert odd.text_ids() != fake_token_ids(text)  # not what the "tokenizer" would produce
    app, upstream = make_gateway([odd, "Bye"])
    rollout = gw_store.enqueue_rollout(Rollout())
    client = gw_client_for(app)
    base = f"/rollouts/{rollout.rollout_id}/v1/chat/completions"
    r1 = await client.post(base, json={**CHAT, "stream": True})
    parse_sse(r1.text)
    history = [*CHAT["messages"], {"role": "assistant", "content": text}, {"role": "user", "content": "ok"}]
    await client.post(base, json={"model": "policy", "messages": history})
    s1, s2 = gw_store.list_spans(rollout_id=rollout.rollout_id)
    assert s1.llm.completion_token_ids == [7001, 7002, 7003] and s1.llm.response_text == text
    # turn 2's prompt ids are the engine's, not turn 1's prompt+completion spliced or re-encoded by us
    engine_prompt = upstream._prompt_ids(upstream.requests[1].body, "chat")
    assert s2.llm.prompt_token_ids == engine_prompt
    assert s2.llm.prompt_token_ids[: len(s1.llm.prompt_token_ids)] == s1.llm.prompt_token_ids


# --- handed case 4 ---------------------------------------------------------------------------------
async def test_reward_kept_and_unattributed_call_stored_as_orphan(
    make_gateway, gw_client_for, gw_store, caplog
) -> None:
    app, _ = make_gateway(["attributed", "bare"])
    rollout = gw_store.enqueue_rollout(Rollout())
    client = gw_client_for(app)
    with caplog.at_level(logging.WARNING, logger="agentforge.gateway"):
        assert (
            await client.post(f"/rollouts/{rollout.rollout_id}/v1/chat/completions", json=CHAT)
        ).status_code == 200
        assert not caplog.records
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    gw_store.add_reward(Reward(rollout_id=rollout.rollout_id, value=0.7))
    assert gw_store.final_reward(rollout.rollout_id).value == pytest.approx(0.7)
    attributed = only_span(gw_store, rollout_id=rollout.rollout_id)
    assert attributed.llm.response_text == "attributed" and "orphan" not in attributed.attributes
    orphan = only_span(gw_store, orphans=True)
    assert (
        orphan.rollout_id is None
        and orphan.attributes["orphan"] is True
        and orphan.llm.response_text == "bare"
    )
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and "orphan" in caplog.records[0].message
    assert app.state.gateway.orphans == 1


async def test_header_attribution_with_attempt(make_gateway, gw_client_for, gw_store) -> None:
    app, _ = make_gateway(["hi"])
    gw_store.enqueue_rollout(Rollout(rollout_id="ro-header"))
    rollout, attempt = gw_store.claim_rollout("worker-1")
    headers = {"X-Rollout-Id": rollout.rollout_id, "X-Attempt-Id": attempt.attempt_id}
    assert (
        await gw_client_for(app).post("/v1/chat/completions", json=CHAT, headers=headers)
    ).status_code == 200
    span = only_span(gw_store, rollout_id="ro-header")
    assert span.attempt_id == attempt.attempt_id and span.kind == "llm" and span.llm.version == "policy@v1"


async def test_unknown_rollout_is_kept_as_orphan_with_the_claimed_id(
    make_gateway, gw_client_for, gw_store
) -> None:
    app, _ = make_gateway(["hi"])
    assert (
        await gw_client_for(app).post("/rollouts/ro-nope/v1/chat/completions", json=CHAT)
    ).status_code == 200
    assert only_span(gw_store, orphans=True).attributes["claimed_rollout_id"] == "ro-nope"


async def test_unknown_attempt_keeps_the_rollout_and_is_logged(
    make_gateway, gw_client_for, gw_store, caplog
) -> None:
    """An ``X-Attempt-Id`` the store does not know does not cost the call its (valid) rollout: the span stays
    in the rollout, names the claimed attempt, is not training data, and the reason is logged every time a
    kind of rejection first shows up, even after an unattributed call's warning."""
    app, _ = make_gateway(["bare", "kept", "other"])
    gw_store.enqueue_rollout(Rollout(rollout_id="ro-attempt"))
    client = gw_client_for(app)
    with caplog.at_level(logging.WARNING, logger="agentforge.gateway"):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200  # unattributed
        headers = {"X-Rollout-Id": "ro-attempt", "X-Attempt-Id": "at-nope"}
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=headers)).status_code == 200
        headers = {"X-Attempt-Id": "at-nope-too"}  # an attempt alone: nothing left to attribute it to
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=headers)).status_code == 200
    kept = only_span(gw_store, rollout_id="ro-attempt")
    assert kept.llm.response_text == "kept" and "orphan" not in kept.attributes
    assert kept.attributes["claimed_attempt_id"] == "at-nope"
    assert kept.llm.trainable is False and "attempt_rejected" in kept.llm.flags
    orphans = {span.llm.response_text: span for span in gw_store.list_spans(orphans=True)}
    assert set(orphans) == {"bare", "other"}  # nothing lost
    assert orphans["other"].attributes["claimed_attempt_id"] == "at-nope-too"
    assert "claimed_rollout_id" not in orphans["other"].attributes
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert "no rollout id" in messages[0]
    assert "'ro-attempt'" in messages[1] and "'at-nope'" in messages[1] and "does not exist" in messages[1]
    assert "orphan" in messages[2] and "'at-nope-too'" in messages[2]
    assert app.state.gateway.orphans == 2


async def test_attribution_warnings_are_rate_limited_per_kind(
    make_gateway, gw_client_for, caplog, monkeypatch
) -> None:
    """A misconfigured client calling many times gets one WARNING a minute per kind, which then says how many
    calls came in between (``DEBUG`` for each of those)."""
    import agentforge.gateway.record as record

    clock = [1000.0]
    monkeypatch.setattr(record.time, "monotonic", lambda: clock[0])
    app, _ = make_gateway(["a"] * 5)
    client = gw_client_for(app)
    with caplog.at_level(logging.WARNING, logger="agentforge.gateway"):
        for step in (0.0, 10.0, 20.0, 45.0):  # seconds after the first call
            clock[0] = 1000.0 + step
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        clock[0] = 1000.0 + 61.0
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "more like it" not in warnings[0] and "(3 more like it in the last minute)" in warnings[1]


# --- handed case 8 ---------------------------------------------------------------------------------
async def test_streamed_no_argument_tool_is_normalised_and_noted(
    make_gateway, gw_client_for, gw_store
) -> None:
    app, _ = make_gateway([ScriptedTurn(tool_calls=[ScriptedToolCall("get_time", "")])])
    chunks = parse_sse(
        (await gw_client_for(app).post("/v1/chat/completions", json={**CHAT, "stream": True})).text
    )
    assert streamed_arguments(chunks) == {0: "{}"}  # the agent can json.loads what it receives
    (call,) = only_span(gw_store, orphans=True).llm.tool_calls
    assert call.name == "get_time" and call.arguments == "" and call.parsed == {}
    assert call.flags == ["empty_arguments_normalised"]


@pytest.mark.parametrize(
    ("raw", "malformed"),
    [
        ('{"code": "if (x) {"}', False),  # unbalanced brace inside a string: valid JSON
        ('{"code": "if (x) {"', True),  # the closing brace of the object is missing
        ('{"city": "Par', True),  # truncated
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_malformed_arguments_are_kept_flagged_and_reported(
    make_gateway, gw_client_for, gw_store, raw, malformed, stream
) -> None:
    app, _ = make_gateway([ScriptedTurn(tool_calls=[ScriptedToolCall("run", raw, id="call-1")])])
    r = await gw_client_for(app).post("/v1/chat/completions", json={**CHAT, "stream": stream})
    assert r.status_code == 200
    if stream:
        received = streamed_arguments(parse_sse(r.text))[0]
        message = {
            "role": "assistant",
            "tool_calls": [
                {"id": "call-1", "type": "function", "function": {"name": "run", "arguments": received}}
            ],
        }
    else:
        message = r.json()["choices"][0]["message"]
        received = message["tool_calls"][0]["function"]["arguments"]
    assert received == raw  # passed through unchanged
    llm = only_span(gw_store, orphans=True).llm
    (call,) = llm.tool_calls
    assert call.arguments == raw and llm.trainable
    assert (call.parsed is None) is malformed and ("malformed_arguments" in call.flags) is malformed
    assert ("malformed_tool_call" in llm.flags) is malformed
    errors = tool_error_messages(message)
    assert [e["tool_call_id"] for e in errors] == (["call-1"] if malformed else [])


# --- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"[1, 2]", b""])
async def test_malformed_body_gets_openai_400_and_no_upstream_call(
    make_gateway, gw_client_for, gw_store, content
) -> None:
    app, upstream = make_gateway(["unused"])
    r = await gw_client_for(app).post(
        "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert set(r.json()["error"]) >= {"message", "type", "code"}
    assert upstream.requests == [] and gw_store.list_spans(orphans=True) == []


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({**CHAT, "model": "gpt-nope"}, 404, "model_not_found"),
        ({"model": "policy", "messages": []}, 400, "invalid_value"),
        ({"messages": CHAT["messages"]}, 400, "invalid_value"),
    ],
)
async def test_invalid_requests_fail_with_a_span(
    make_gateway, gw_client_for, gw_store, body, status, code
) -> None:
    app, upstream = make_gateway(["unused"])
    r = await gw_client_for(app).post("/v1/chat/completions", json=body)
    assert r.status_code == status and r.json()["error"]["code"] == code
    span = only_span(gw_store, orphans=True)
    assert span.status == "error" and span.error == r.json()["error"]["message"] and not span.llm.trainable
    assert upstream.requests == []


async def test_two_megabyte_tool_output_is_stored_and_forwarded_byte_exact(
    make_gateway, gw_client_for, gw_store
) -> None:
    unit = "👩‍👩‍👧 家族 “quoted” ‘single’ — naïve 🚀\n"
    output = unit * (2_000_000 // len(unit.encode()) + 1)
    assert len(output.encode()) > 2_000_000
    messages = [
        *CHAT["messages"],
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "dump", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": output},
    ]
    app, upstream = make_gateway([ScriptedTurn("done", prompt_token_ids=[1, 2, 3])])
    r = await gw_client_for(app).post(
        "/v1/chat/completions", content=json.dumps({"model": "policy", "messages": messages}).encode()
    )
    assert r.status_code == 200
    assert upstream.requests[0].body["messages"][-1]["content"] == output
    stored = only_span(gw_store, orphans=True).llm.request["messages"][-1]["content"]
    assert stored.encode("utf-8") == output.encode("utf-8")


# --- upstream failures -----------------------------------------------------------------------------
async def test_upstream_500_reaches_client_as_openai_error(make_gateway, gw_client_for, gw_store) -> None:
    app, _ = make_gateway([ScriptedTurn(error=ScriptedError(500, "engine exploded"))])
    r = await gw_client_for(app).post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 500 and r.json()["error"]["message"] == "engine exploded"
    span = only_span(gw_store, orphans=True)
    assert span.status == "error" and "engine exploded" in span.error and "upstream_error" in span.llm.flags


async def test_context_overflow_passes_the_upstream_400_through(gw_store, gw_client_for) -> None:
    from agentforge.testing import ScriptedUpstream

    upstream = ScriptedUpstream(["unused"], max_model_len=8)
    app = create_gateway(gw_store, upstream.router(), transport=upstream.transport())
    long = {"model": "policy", "messages": [{"role": "user", "content": "x" * 400}], "stream": True}
    r = await gw_client_for(app).post("/v1/chat/completions", json=long)
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
    span = only_span(gw_store, orphans=True)
    assert span.status == "error" and "maximum context length" in span.error
    assert span.llm.stream is True and span.attributes["http_status"] == 400


async def test_error_inside_a_stream_is_relayed_and_recorded(make_gateway, gw_client_for, gw_store) -> None:
    app, _ = make_gateway([ScriptedTurn("x", error=ScriptedError(message="died mid-stream", in_stream=True))])
    chunks = parse_sse(
        (await gw_client_for(app).post("/v1/chat/completions", json={**CHAT, "stream": True})).text
    )
    assert chunks[-1]["error"]["message"] == "died mid-stream"
    span = only_span(gw_store, orphans=True)
    assert span.status == "error" and not span.llm.trainable


@pytest.mark.parametrize("stream", [False, True])
async def test_connection_refused_is_503_and_releases(gw_store, gw_client_for, stream) -> None:
    """Nothing was sent: 503 ``engine_unavailable``, which a load balancer may retry on another replica."""
    router = ModelRouter()
    router.register(
        "policy@v1", Upstream("http://127.0.0.1:9/v1", "base")
    )  # port 9 (discard): nothing listens
    router.set_alias("policy", "policy@v1")
    app = create_gateway(gw_store, router)
    r = await gw_client_for(app).post("/v1/chat/completions", json={**CHAT, "stream": stream})
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
    assert "nothing was sent" in r.json()["error"]["message"]
    assert only_span(gw_store, orphans=True).status == "error"
    assert router.inflight("policy@v1") == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_connection_closed_before_the_answer_is_502(gw_store, gw_client_for, stream) -> None:
    """The engine took the connection and closed it unanswered (it may have begun the call): 502, not the
    retryable 503."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def close_unanswered() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.close()

    threading.Thread(target=close_unanswered, daemon=True).start()
    try:
        router = ModelRouter()
        router.register("policy@v1", Upstream(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", "base"))
        router.set_alias("policy", "policy@v1")
        app = create_gateway(gw_store, router)
        r = await gw_client_for(app).post("/v1/chat/completions", json={**CHAT, "stream": stream})
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unreachable"
        assert router.inflight("policy@v1") == 0
    finally:
        listener.close()


async def test_upstream_timeout_is_504(gw_store, gw_client_for) -> None:
    from agentforge.testing import ScriptedUpstream

    upstream = ScriptedUpstream([ScriptedTurn("late", delay_s=1.0)])
    with upstream.serve() as server:  # a real socket: httpx enforces timeouts only on the network path
        router = upstream.router(base_url=f"{server.url}/v1")
        app = create_gateway(gw_store, router, timeout_s=0.2)
        r = await gw_client_for(app).post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    assert (
        only_span(gw_store, orphans=True).llm.flags == ["upstream_timeout"]
        and router.inflight("policy@v1") == 0
    )


async def test_hosted_upstream_without_ids_is_kept_untrainable(make_gateway, gw_client_for, gw_store) -> None:
    app, _ = make_gateway([ScriptedTurn("hi", omit_token_ids=True)])
    assert (await gw_client_for(app).post("/v1/chat/completions", json=CHAT)).status_code == 200
    llm = only_span(gw_store, orphans=True).llm
    assert llm.completion_token_ids is None and not llm.trainable and "no_token_ids" in llm.flags


async def test_inflight_count_returns_to_zero(make_gateway, gw_client_for) -> None:
    app, upstream = make_gateway(["a", "b"])
    client = gw_client_for(app)
    await client.post("/v1/chat/completions", json=CHAT)
    await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert app.state.gateway.router.inflight("policy@v1") == 0


# --- routes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/v1/unload_lora_adapter"),
        ("POST", "/rollouts/ro-1/v1/load_lora_adapter"),
        ("GET", "/adapters"),
        ("POST", "/v1/embeddings"),
    ],
)
async def test_admin_and_unknown_routes_are_not_forwarded(make_gateway, gw_client_for, method, path) -> None:
    app, upstream = make_gateway([])
    r = await gw_client_for(app).request(method, path, json={"lora_name": "x", "lora_path": "/tmp/x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert upstream.admin_requests == [] and upstream.requests == []


async def test_models_lists_aliases_and_versions(make_gateway, gw_client_for) -> None:
    app, _ = make_gateway([])
    for path in ("/v1/models", "/rollouts/ro-1/v1/models"):
        data = (await gw_client_for(app).get(path)).json()
        assert [m["id"] for m in data["data"]] == ["policy", "policy@v1"]


async def test_store_api_is_mounted_on_the_gateway_port(make_gateway, gw_client_for) -> None:
    app, _ = make_gateway([])
    assert (await gw_client_for(app).get("/api/store/health")).status_code == 200
    bare, _ = make_gateway([], include_store_api=False)
    assert (await gw_client_for(bare).get("/api/store/health")).status_code == 404


async def test_api_key_is_enforced_when_set(make_gateway, gw_client_for) -> None:
    app, _ = make_gateway(["hi"], api_key="s3cret-key-0123456789")
    client = gw_client_for(app)
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert (
        await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer wrong"})
    ).status_code == 401
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/api/rollouts")).status_code == 401  # the store routes check the same key
    ok = await client.post(
        "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer s3cret-key-0123456789"}
    )
    assert ok.status_code == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "gateway.example.com"])
def test_non_loopback_bind_needs_an_api_key(gw_store, host) -> None:
    router = ModelRouter()
    with pytest.raises(UserError, match="without an API key"):
        GatewayServer(gw_store, router, host=host)
    GatewayServer(gw_store, router, host=host, api_key="k" * 16)  # builds; binding happens only in start()


def test_gateway_server_serves_on_a_free_loopback_port(gw_store) -> None:
    with GatewayServer(gw_store, ModelRouter(), include_store_api=False) as server:
        assert server.port > 0 and server.openai_base_url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
        assert server.rollout_base_url("ro-1") == f"{server.url}/rollouts/ro-1/v1"
