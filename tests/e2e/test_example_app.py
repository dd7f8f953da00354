"""The customer-service app (examples/app/service.py) embeds an agent in a FastAPI service: every
conversation is a rollout whose LLM calls go through the gateway, and user feedback becomes its reward.

The app runs in-process (``TestClient``); behind it, a real gateway port in front of a scripted engine
on a real port. Checked: a conversation's spans are attributed to its rollout and token-exact; feedback
becomes the rollout's final reward (also after close, also over the store's HTTP API); unknown sessions
get a 404 that says what to do; a streamed turn is valid SSE and records the same tokens as a plain turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from example_app import load_service
from fastapi.testclient import TestClient

from agentforge.gateway.server import GatewayServer
from agentforge.stores.http import HTTPStore
from agentforge.stores.sql import SQLStore
from agentforge.testing import ScriptedError, ScriptedToolCall, ScriptedTurn, ScriptedUpstream
from agentforge.types import Rollout, RolloutState, SpanKind

W1001 = json.dumps({"order_id": "W1001"})
ADMIN_KEY = "app-admin-key-0123456789"  # the gateway's store API publishes versions only with it

service = load_service()


def order_turns() -> list[ScriptedTurn | str]:
    """One user turn's script: a tool call (fixed id, so replays are identical), then the answer."""
    call = ScriptedToolCall("get_order_status", W1001, id="call_w1001")
    return [ScriptedTurn(tool_calls=[call]), "Your order W1001 is delivered."]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[GatewayServer, SQLStore, ScriptedUpstream]]:
    """Scripted engine on a port → real gateway on a port → a SQLite store (the test writes the script)."""
    upstream = ScriptedUpstream()
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    engine = upstream.serve()
    try:
        with GatewayServer(
            store, upstream.router(base_url=f"{engine.url}/v1"), admin_key=ADMIN_KEY
        ) as gateway:
            yield gateway, store, upstream
    finally:
        engine.stop()
        store.close()


@pytest.fixture
def app_client(stack) -> Iterator[TestClient]:
    """The app (writing to the gateway's store directly) under a test client."""
    gateway, store, _ = stack
    with TestClient(service.create_app(gateway.url, store)) as client:
        yield client


#: session id → the session token ``POST /sessions`` returned (what the app's user holds).
TOKENS: dict[str, str] = {}


def auth(session_id: str) -> dict[str, str]:
    """The ``Authorization`` header of a session's owner (none for a session this test never started)."""
    token = TOKENS.get(session_id)
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def started(resp: Any) -> str:
    """Remember the token of a session ``POST /sessions`` just started; returns its id."""
    assert resp.status_code == 201, resp.text
    TOKENS[resp.json()["session_id"]] = resp.json()["session_token"]
    return resp.json()["session_id"]


def new_session(client: TestClient) -> str:
    resp = client.post("/sessions", json={"user": "u-1"})
    assert resp.json()["state"] == "running"
    return started(resp)


def say(client: TestClient, session_id: str, text: str) -> dict[str, Any]:
    resp = client.post(f"/sessions/{session_id}/messages", json={"content": text}, headers=auth(session_id))
    assert resp.status_code == 200, resp.text
    return resp.json()


def parse_sse(body: str) -> list[tuple[str, dict[str, Any]]]:
    """``(event, data)`` pairs of a server-sent-event body; fails on anything that is not well formed."""
    assert body.endswith("\n\n"), "an event stream ends with a blank line"
    events = []
    for block in body.strip("\n").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        assert set(fields) == {"event", "data"}, block
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def test_conversation_is_a_rollout_and_feedback_is_its_reward(stack, app_client: TestClient) -> None:
    gateway, store, upstream = stack
    upstream.add(*order_turns(), "You're welcome!")
    sid = new_session(app_client)
    rollout = store.get_rollout(sid)
    assert rollout.agent == service.AGENT and rollout.state is RolloutState.running

    first = say(app_client, sid, "Where is my order W1001?")
    second = say(app_client, sid, "Thanks!")

    assert first == {
        "reply": "Your order W1001 is delivered.",
        "tool_calls": [
            {"name": "get_order_status", "arguments": W1001, "result": "delivered, 1 water bottle"}
        ],
    }
    assert second == {"reply": "You're welcome!", "tool_calls": []}
    spans = store.list_spans(rollout_id=sid, kind=SpanKind.llm)
    assert len(spans) == 3 and not store.list_spans(orphans=True)
    for span in spans:
        assert span.status == "ok" and span.llm.trainable and span.llm.model == "policy"
        assert span.llm.prompt_token_ids and len(span.llm.logprobs) == len(span.llm.completion_token_ids) > 0
    assert spans[1].llm.request["messages"][-1]["content"] == "delivered, 1 water bottle"
    assert spans[2].llm.request["messages"][-1] == {"role": "user", "content": "Thanks!"}

    resp = app_client.post(
        f"/sessions/{sid}/feedback", json={"score": 1, "comment": "quick and right"}, headers=auth(sid)
    )
    assert resp.status_code == 200, resp.text
    reward = store.final_reward(sid)
    assert reward is not None and reward.reward_id == resp.json()["reward_id"]
    assert (reward.value, reward.source, reward.name) == (1.0, "user_feedback", "user_feedback")
    assert reward.final and reward.metadata["comment"] == "quick and right"
    assert reward.span_id == spans[-1].span_id  # attached after the conversation's last call

    resp = app_client.post(f"/sessions/{sid}/close", headers=auth(sid))
    assert resp.status_code == 200 and resp.json()["state"] == "succeeded"
    assert store.get_rollout(sid).state is RolloutState.succeeded
    assert (
        app_client.post(f"/sessions/{sid}/close", headers=auth(sid)).json()["state"] == "succeeded"
    )  # idempotent
    resp = app_client.post(f"/sessions/{sid}/messages", json={"content": "one more thing"}, headers=auth(sid))
    assert resp.status_code == 409 and "POST /sessions" in resp.json()["detail"]


def test_late_feedback_after_close_attaches_over_http(stack) -> None:
    gateway, store, upstream = stack
    upstream.add(*order_turns())
    with (
        HTTPStore(gateway.url, admin_key=ADMIN_KEY) as http_store,  # the app publishes its first prompt
        TestClient(service.create_app(gateway.url, http_store)) as client,
    ):
        sid = new_session(client)
        say(client, sid, "Where is my order W1001?")
        assert client.post(f"/sessions/{sid}/close", headers=auth(sid)).status_code == 200

        assert (
            client.post(f"/sessions/{sid}/feedback", json={"score": -1}, headers=auth(sid)).status_code == 200
        )
        assert store.final_reward(sid).value == -1.0
        assert (
            client.post(f"/sessions/{sid}/feedback", json={"score": 0.25}, headers=auth(sid)).status_code
            == 200
        )

    rewards = store.list_rewards(sid)
    assert [r.value for r in rewards] == [-1.0, 0.25]
    assert store.final_reward(sid).value == 0.25  # the user's last word trains
    assert store.get_rollout(sid).state is RolloutState.succeeded


def test_unknown_session_is_404_with_a_clear_message(stack, app_client: TestClient) -> None:
    _, store, _ = stack
    other = store.enqueue_rollout(Rollout(agent="some-runner-agent"))  # a rollout, but not a session
    for sid in ("no-such-session", other.rollout_id):
        resp = app_client.post(f"/sessions/{sid}/feedback", json={"score": 1}, headers=auth(sid))
        assert resp.status_code == 404
        assert (
            resp.json()["detail"] == f"no session {sid!r}: unknown session id (start one with POST /sessions)"
        )
        assert (
            app_client.post(
                f"/sessions/{sid}/messages", json={"content": "hi"}, headers=auth(sid)
            ).status_code
            == 404
        )
        assert app_client.post(f"/sessions/{sid}/close", headers=auth(sid)).status_code == 404
    assert store.list_rewards(other.rollout_id) == []
    assert store.get_rollout(other.rollout_id).state is RolloutState.queued
    sid = new_session(app_client)
    assert (
        app_client.post(f"/sessions/{sid}/feedback", json={"score": "great"}, headers=auth(sid)).status_code
        == 422
    )


def test_streamed_turn_is_valid_sse_with_the_same_spans(stack, app_client: TestClient) -> None:
    _, store, upstream = stack
    upstream.add(*order_turns(), *order_turns())
    plain_sid, streamed_sid = new_session(app_client), new_session(app_client)
    plain = say(app_client, plain_sid, "Where is my order W1001?")

    resp = app_client.post(
        f"/sessions/{streamed_sid}/messages",
        json={"content": "Where is my order W1001?", "stream": True},
        headers=auth(streamed_sid),
    )

    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(resp.text)
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "tool" and kinds[-1] == "done" and kinds.count("done") == 1
    assert set(kinds[1:-1]) == {"delta"} and len(kinds) > 3, "the answer arrives in several pieces"
    done = events[-1][1]
    assert "".join(data["text"] for kind, data in events if kind == "delta") == done["reply"]
    assert done == plain and events[0][1] == plain["tool_calls"][0]

    plain_spans = store.list_spans(rollout_id=plain_sid, kind=SpanKind.llm)
    streamed_spans = store.list_spans(rollout_id=streamed_sid, kind=SpanKind.llm)
    assert len(plain_spans) == len(streamed_spans) == 2
    for p, s in zip(plain_spans, streamed_spans, strict=True):
        assert s.llm.stream and not p.llm.stream and s.llm.trainable
        assert s.llm.prompt_token_ids == p.llm.prompt_token_ids
        assert s.llm.completion_token_ids == p.llm.completion_token_ids
        assert s.llm.logprobs == p.llm.logprobs
        assert [c.name for c in s.llm.tool_calls] == [c.name for c in p.llm.tool_calls]


def test_failed_model_call_is_502_and_the_turn_is_dropped(stack, app_client: TestClient) -> None:
    _, store, upstream = stack
    # A 400 (e.g. the context is full): the OpenAI SDK does not retry it, so the app sees it.
    error = ScriptedTurn(error=ScriptedError(400, "prompt too long", "BadRequestError"))
    upstream.add(error, error, "Hello again.")
    sid = new_session(app_client)

    resp = app_client.post(f"/sessions/{sid}/messages", json={"content": "first try"}, headers=auth(sid))
    assert resp.status_code == 502 and "prompt too long" in resp.json()["detail"]
    resp = app_client.post(
        f"/sessions/{sid}/messages", json={"content": "streamed try", "stream": True}, headers=auth(sid)
    )
    ((kind, data),) = parse_sse(resp.text)
    assert kind == "error" and "prompt too long" in data["detail"]
    assert say(app_client, sid, "second try")["reply"] == "Hello again."

    last = store.list_spans(rollout_id=sid, kind=SpanKind.llm)[-1].llm.request["messages"]
    assert [m["content"] for m in last if m["role"] == "user"][-1:] == ["second try"]
    assert not {"first try", "streamed try"} & {m["content"] for m in last}
    assert store.get_rollout(sid).state is RolloutState.running


def test_new_prompt_version_applies_to_the_next_session_without_restart(
    stack, app_client: TestClient
) -> None:
    from agentforge.prompts import publish_prompt, rollouts_with_prompt

    gateway, store, upstream = stack
    upstream.add("Hi from v1.", "Hi from v2.", "Still v1.", "Pinned v1.")
    first = new_session(app_client)
    say(app_client, first, "Hello")
    publish_prompt(store, service.PROMPT_NAME, "You are AcmeBot v2. Be brief.")
    second = new_session(app_client)  # same app process: nothing restarted
    say(app_client, second, "Hello")
    say(app_client, first, "Still there?")  # an open session keeps the version it started with
    resp = app_client.post("/sessions", json={"prompt_version": 1})
    assert resp.status_code == 201 and resp.json()["prompt_version"] == 1
    say(app_client, started(resp), "Hello")

    systems = [r.body["messages"][0]["content"] for r in upstream.requests]
    v1 = service.chat_agent.SYSTEM
    assert systems == [v1, "You are AcmeBot v2. Be brief.", v1, v1]
    assert store.get_rollout(first).resources == {service.PROMPT_NAME: "1"}
    assert store.get_rollout(second).resources == {service.PROMPT_NAME: "2"}
    assert [r.rollout_id for r in rollouts_with_prompt(store, service.PROMPT_NAME, 2)] == [second]
    resp = app_client.post("/sessions", json={"prompt_version": 9})
    assert resp.status_code == 404 and "has no version 9 (versions: [1, 2])" in resp.json()["detail"]


def test_only_the_session_owner_may_talk_rate_or_close_it(stack, app_client: TestClient) -> None:
    """Each session's routes need the token POST /sessions returned for it; the store keeps only its hash."""
    _, store, upstream = stack
    upstream.add("Hi.", "Hi.")
    mine, theirs = new_session(app_client), new_session(app_client)
    assert TOKENS[mine] not in str(store.get_rollout(mine).model_dump())
    for headers in ({}, auth(theirs), {"Authorization": TOKENS[mine]}, {"Authorization": "Bearer nope"}):
        for route, body in (("messages", {"content": "hi"}), ("feedback", {"score": -1}), ("close", None)):
            resp = app_client.post(f"/sessions/{mine}/{route}", json=body, headers=headers)
            assert resp.status_code == 401 and "session_token" in resp.json()["detail"], (route, headers)
    assert store.list_rewards(mine) == [] and store.get_rollout(mine).state is RolloutState.running
    assert say(app_client, mine, "hello")["reply"] == "Hi."
    assert app_client.post(f"/sessions/{mine}/close", headers=auth(mine)).status_code == 200
    resp = app_client.post(f"/sessions/{mine}/feedback", json={"score": 1}, headers=auth(theirs))
    assert resp.status_code == 401  # also after close, when only the stored hash can say who owns it
    assert (
        app_client.post(f"/sessions/{mine}/feedback", json={"score": 1}, headers=auth(mine)).status_code
        == 200
    )


def test_an_app_key_guards_new_sessions(stack) -> None:
    gateway, store, _ = stack
    key = "app-key-0123456789abcdef"
    with TestClient(service.create_app(gateway.url, store, app_key=key)) as client:
        assert client.post("/sessions", json={}).status_code == 401
        assert client.post("/sessions", json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert (
            client.post("/sessions", json={}, headers={"Authorization": f"Bearer {key}"}).status_code == 201
        )


def test_forget_finds_the_apps_users_and_sessions_not_what_clients_claim(
    stack, app_client: TestClient
) -> None:
    """Issue 36, High 3: the app enqueues each session's rollout with ``session_id`` (its id) and ``user_id``
    (its user); ``forget --user`` deletes that user's conversations, spans included, and ``forget --session``
    deletes the named session even when another user wrote its id into her own session's metadata."""
    from agentforge.errors import NotFoundError
    from agentforge.stores.forget import forget

    gateway, store, upstream = stack
    upstream.add(*order_turns(), *order_turns())
    olivia = started(app_client.post("/sessions", json={"user": "olivia_ito_3591"}))
    say(app_client, olivia, "Where is my order W1001?")
    body = {"user": "mallory", "metadata": {"session_id": olivia, "user_id": "olivia_ito_3591"}}
    mallory = started(app_client.post("/sessions", json=body))
    say(app_client, mallory, "Where is my order W1001?")
    assert len(store.list_spans(rollout_id=olivia, kind=SpanKind.llm)) == 2

    report = forget(store, sessions=[olivia], vacuum=False)  # the report's steer, as an attacker ran it
    assert report.rollout_ids == [olivia] and report.deleted["spans"] >= 2
    assert report.named_in_metadata == [mallory]
    assert (
        store.get_rollout(mallory).user_id == "mallory" and store.get_rollout(mallory).session_id == mallory
    )
    with pytest.raises(NotFoundError):
        store.get_rollout(olivia)
    assert len(store.list_spans(rollout_id=mallory, kind=SpanKind.llm)) == 2
    assert forget(store, users=["mallory"], vacuum=False).rollout_ids == [mallory]
    assert (
        app_client.post("/sessions", json={"user": "x" * 201}).status_code == 422
    )  # a clear error, not a 500


def test_without_the_admin_key_the_app_says_what_is_missing(stack) -> None:
    """Issue 36, Low: on a store that has no prompt yet, the app without the store's admin key answered a bare 500;
    now a 503 that names the missing key."""
    gateway, _, _ = stack
    with (
        HTTPStore(gateway.url) as http_store,
        TestClient(service.create_app(gateway.url, http_store)) as client,
    ):
        resp = client.post("/sessions", json={"user": "u-1"})
    assert resp.status_code == 503 and "admin key" in resp.json()["detail"], resp.text
