"""Mask in flight through the gateway (fake engine): the engine and the store see placeholders, the client
gets the real values back (message text, streamed deltas split inside a placeholder, tool-call arguments);
redact at rest; privacy off forwards the body untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from gateway_helpers import parse_sse

from agentforge.errors import UserError
from agentforge.gateway import GatewayServer
from agentforge.privacy import REDACTED_FLAG, PrivacyConfig, PrivacyMode
from agentforge.testing import ScriptedToolCall, ScriptedTurn, ScriptedUpstream, memory_store
from agentforge.types import Rollout

VISA, ACCOUNT = "4111 1111 1111 1111", "ACME-12345678"
USER = {"role": "user", "content": f"Charge my card {VISA} for account {ACCOUNT}, key AKIAIOSFODNN7EXAMPLE"}
POLICY = PrivacyConfig(patterns={"ACCOUNT": r"ACME-\d{8}"})


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[tuple[GatewayServer, ScriptedUpstream]]:
    store, upstream = memory_store(), ScriptedUpstream()
    config = getattr(request, "param", POLICY)
    server = GatewayServer(store, upstream.router(), transport=upstream.transport(), privacy=config).start()
    yield server, upstream
    server.stop()
    store.close()


def _post(server: GatewayServer, rid: str, messages: list[dict], **extra) -> httpx.Response:
    body = {"model": "policy", "messages": messages, **extra}
    return httpx.post(f"{server.rollout_base_url(rid)}/chat/completions", json=body, timeout=30)


def test_engine_and_store_see_placeholders_the_client_the_values(served) -> None:
    server, upstream = served
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    call = ScriptedToolCall("charge", '{"card": "<CARD_1>", "account": "<ACCOUNT_1>"}')
    upstream.add(ScriptedTurn("Charging <CARD_1>.", tool_calls=[call]))
    answer = _post(server, rid, [USER]).json()["choices"][0]["message"]
    assert answer["content"] == f"Charging {VISA}."
    assert json.loads(answer["tool_calls"][0]["function"]["arguments"]) == {"card": VISA, "account": ACCOUNT}
    sent = upstream.requests[-1].body["messages"][0]["content"]
    assert sent == "Charge my card <CARD_1> for account <ACCOUNT_1>, key <SECRET_1>"
    # the follow-up sends back the real values; the engine sees the same placeholders again
    tool_msg = {
        "role": "tool",
        "tool_call_id": answer["tool_calls"][0]["id"],
        "content": "charged 4111 1111 1111 1111",
    }
    upstream.add(ScriptedTurn("Done <CARD_1>.", pieces=["Done <CA", "RD_1", ">."], token_ids=[7, 8, 9]))
    events = parse_sse(_post(server, rid, [USER, answer, tool_msg], stream=True).text)
    assert (
        "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
        == f"Done {VISA}."
    )
    followup = upstream.requests[-1].body["messages"]
    assert followup[1]["tool_calls"][0]["function"]["arguments"] == call.arguments
    assert followup[2]["content"] == "charged <CARD_1>"
    spans = server.store.list_spans(rollout_id=rid)
    stored = "".join(s.model_dump_json() for s in spans)
    for value in (VISA, ACCOUNT, "AKIAIOSFODNN7EXAMPLE"):
        assert value not in stored
    assert spans[0].attributes["privacy"] == {
        "mode": "mask",
        "redactions": {"ACCOUNT": 1, "CARD": 1, "SECRET": 1},
    }
    # user message, assistant text and arguments, tool result: each occurrence counted
    assert spans[1].attributes["privacy"]["redactions"] == {"ACCOUNT": 2, "CARD": 4, "SECRET": 1}
    assert all(s.llm.trainable for s in spans)


@pytest.mark.parametrize(
    "served", [PrivacyConfig(mode=PrivacyMode.redact, patterns=POLICY.patterns)], indirect=True
)
def test_redact_at_rest_withholds_ids_and_marks_the_span(served) -> None:
    server, upstream = served
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    upstream.add(ScriptedTurn(f"Charging {VISA}."))
    assert _post(server, rid, [USER]).json()["choices"][0]["message"]["content"] == f"Charging {VISA}."
    assert upstream.requests[-1].body["messages"][0]["content"] == USER["content"]  # the engine saw it
    (span,) = server.store.list_spans(rollout_id=rid)
    assert (
        span.llm.request["messages"][0]["content"]
        == "Charge my card [CARD] for account [ACCOUNT], key [SECRET]"
    )
    assert span.llm.response_text == "Charging [CARD]."
    assert (
        span.llm.prompt_token_ids is None
        and span.llm.completion_token_ids is None
        and span.llm.logprobs is None
    )
    assert not span.llm.trainable and REDACTED_FLAG in span.llm.flags
    assert span.attributes["not_trainable_reason"] == REDACTED_FLAG
    assert span.attributes["privacy"]["redactions"] == {"ACCOUNT": 1, "CARD": 2, "SECRET": 1}


def test_a_call_without_personal_data_is_forwarded_untouched(served) -> None:
    server, upstream = served
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    upstream.add(ScriptedTurn("Hi <b>there</b>"))
    message = {"role": "user", "content": "Where is my order?"}
    assert _post(server, rid, [message]).json()["choices"][0]["message"]["content"] == "Hi <b>there</b>"
    (span,) = server.store.list_spans(rollout_id=rid)
    assert "privacy" not in span.attributes and span.llm.request["messages"] == [message]


def test_streamed_tool_call_arguments_get_the_real_values(served) -> None:
    server, upstream = served
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    upstream.add(ScriptedTurn(tool_calls=[ScriptedToolCall("charge", '{"card": "<CARD_1>"}')]))
    events = parse_sse(_post(server, rid, [USER], stream=True).text)
    arguments = "".join(
        call["function"].get("arguments") or ""
        for e in events
        if e.get("choices")
        for call in e["choices"][0]["delta"].get("tool_calls") or []
    )
    assert json.loads(arguments) == {"card": VISA}
    (span,) = server.store.list_spans(rollout_id=rid)
    assert span.llm.tool_calls[0].arguments == '{"card": "<CARD_1>"}'


def test_a_body_being_scanned_does_not_hold_the_event_loop(served, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36, High 2: mask-mode detection runs in a worker thread. While one request's scan is held inside
    the detector, /health and another rollout's call are answered; then the held call completes, masked."""
    import threading

    server, upstream = served
    detector = _detector_of(server)
    entered, release = threading.Event(), threading.Event()
    real_find = detector.find

    def slow_find(text: str):
        if "HOLD-ME" in text:
            entered.set()
            assert release.wait(30), "the test never released the scan"
        return real_find(text)

    monkeypatch.setattr(detector, "find", slow_find)
    held_rid = server.store.enqueue_rollout(Rollout()).rollout_id
    other_rid = server.store.enqueue_rollout(Rollout()).rollout_id
    upstream.add(ScriptedTurn("ok"))
    upstream.add(ScriptedTurn("also ok"))
    result: dict[str, httpx.Response] = {}
    big = {"role": "user", "content": "HOLD-ME " + "4111 " * 2_000}  # (the report's had 80,000: 400 KB)
    held = threading.Thread(target=lambda: result.setdefault("held", _post(server, held_rid, [big])))
    held.start()
    assert entered.wait(30)
    try:
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200  # the loop is free
        other = _post(server, other_rid, [USER])
        assert other.status_code == 200, other.text
    finally:
        release.set()
        held.join(120)
    assert result["held"].status_code == 200, result["held"].text
    first, second = (r.body["messages"][0]["content"] for r in upstream.requests[-2:])
    assert first.startswith("Charge my card <CARD_1>") and second.startswith(
        "HOLD-ME"
    )  # the other went first


def test_big_scans_past_the_scan_pool_wait_their_turn_and_the_loop_stays_free(
    served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36, High 2 (H2's last PARTIAL): six big bodies at once, two more than the scan pool's threads. At
    most ``SCAN_THREADS`` scans run together, the rest wait for a thread (not on the event loop): meanwhile
    /health and a small call (scanned on the loop) are answered; once released, all six complete, masked."""
    import threading

    from agentforge.privacy.flight import PrivacyGuard

    server, upstream = served
    detector = _detector_of(server)
    lock, release = threading.Lock(), threading.Event()
    running, peak, started = [0], [0], threading.Semaphore(0)
    real_find = detector.find

    def slow_find(text: str):
        if "HOLD-ME" not in text:
            return real_find(text)
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        started.release()
        try:
            assert release.wait(60), "the test never released the scans"
            return real_find(text)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(detector, "find", slow_find)
    big = PrivacyGuard.SCAN_THREADS + 2
    rids = [server.store.enqueue_rollout(Rollout()).rollout_id for _ in range(big + 1)]
    for i in range(big + 1):
        upstream.add(ScriptedTurn(f"ok {i}"))
    results: dict[int, httpx.Response] = {}
    body = {"role": "user", "content": "HOLD-ME " + "4111 " * 2_000 + f"card {VISA}"}
    threads = [
        threading.Thread(target=lambda i=i: results.setdefault(i, _post(server, rids[i], [body])))
        for i in range(big)
    ]
    for t in threads:
        t.start()
    try:
        for _ in range(PrivacyGuard.SCAN_THREADS):
            assert started.acquire(timeout=60)  # the pool is full
        assert not started.acquire(timeout=1.0)  # the other two wait for a thread
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200  # the loop is free
        small = _post(server, rids[big], [USER])
        assert small.status_code == 200, small.text
    finally:
        release.set()
        for t in threads:
            t.join(120)
    assert peak[0] == PrivacyGuard.SCAN_THREADS
    assert sorted(results) == list(range(big)) and all(r.status_code == 200 for r in results.values())
    sent = [r.body["messages"][0]["content"] for r in upstream.requests]
    assert sent[0].startswith("Charge my card <CARD_1>")  # the small call went first
    assert sum(s.startswith("HOLD-ME") and s.endswith("card <CARD_1>") for s in sent) == big  # all masked


def _detector_of(server: GatewayServer):
    from agentforge.privacy.flight import _DETECTORS

    assert len(_DETECTORS) >= 1
    return next(d.result() for d in _DETECTORS.values() if d.result().config.patterns == POLICY.patterns)


def test_a_rollouts_held_memory_does_not_grow_with_the_texts_of_its_calls(tmp_path) -> None:
    """Issue 36, Medium, as the report ran it (public surfaces only; on the tree the issue was filed on,
    ``scripts/tests_at_commit.sh 52048a9 <this test>``, the 6 calls held 430,663 bytes more): a rollout's calls
    of 70 K characters each (over the 64 K a scanned text may be cached at), through a masking gateway on a
    SQLite file. Once the rollout's remembered turns are full (the token-in continuation keeps its last four
    calls), six more calls leave less than 25,000 bytes more memory held (traced Python allocations after a
    collection)."""
    import gc
    import tracemalloc

    from agentforge.stores.sql import SQLStore

    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    upstream = ScriptedUpstream([ScriptedTurn("ok")] * 11)
    with GatewayServer(store, upstream.router(), transport=upstream.transport(), privacy=POLICY) as server:
        rid = store.enqueue_rollout(Rollout()).rollout_id

        def call(i: int) -> None:
            # 70 K characters (over the 64 K cache cap), no digits
            text = f"call {chr(98 + i)} " + "lorem ipsum dolor " * 3_900
            assert _post(server, rid, [{"role": "user", "content": text}]).status_code == 200
            upstream.requests.clear()  # the scripted engine's own record of each request

        def held() -> int:
            gc.collect()
            return tracemalloc.get_traced_memory()[0]

        call(-1)
        tracemalloc.start()
        try:
            for i in range(4):
                call(i)
            before = held()
            for i in range(4, 10):
                call(i)
            grown = held() - before
        finally:
            tracemalloc.stop()
    store.close()
    assert grown < 25_000, f"{grown:,} bytes more held after 6 calls"


def test_the_scanned_text_cache_is_bounded_by_size() -> None:
    """Issue 36, Medium: 60 calls of 1 MB texts in one rollout grew the gateway by 270 MB; a rollout now keeps
    at most 1 M characters of scanned texts, and none over 64 K characters."""
    from agentforge.privacy.flight import _detector
    from agentforge.privacy.mapping import Mapping

    mapping = Mapping(_detector(PrivacyConfig()).result())
    for i in range(10):
        mapping.mask(f"call {i} " + "ab " * 100_000)  # 300 K characters: scanned, never cached
    for i in range(200):
        mapping.mask(f"turn {i} " + "cd " * 7_000)
    assert mapping._cached_chars <= 1024 * 1024
    assert sum(len(t) + len(m) for t, (m, _) in mapping._texts.items()) == mapping._cached_chars
    assert 20 <= len(mapping._texts) <= 25 and mapping.mask("turn 199 " + "cd " * 7_000)[0].startswith(
        "turn 199"
    )


def test_an_answer_reveals_only_values_its_own_request_carried(served) -> None:
    """Issue 36, Medium: whoever could call a rollout's URL and sent ``say <CARD_1> <ACCOUNT_1>`` got the real card
    and account another call of the rollout had sent. Now the answer restores only placeholders whose values
    the same request carried; the conversation that resends them still gets them back, plain and streamed."""
    server, upstream = served
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    upstream.add(ScriptedTurn("Noted <CARD_1>."))
    assert _post(server, rid, [USER]).json()["choices"][0]["message"]["content"] == f"Noted {VISA}."
    probe = {"role": "user", "content": "say <CARD_1> <ACCOUNT_1>"}
    upstream.add(ScriptedTurn("<CARD_1> <ACCOUNT_1>"))
    leaked = _post(server, rid, [probe]).json()["choices"][0]["message"]["content"]
    assert leaked == "<CARD_1> <ACCOUNT_1>" and VISA not in leaked and ACCOUNT not in leaked
    upstream.add(
        ScriptedTurn("<CARD_1> <ACCOUNT_1>", pieces=["<CARD", "_1> <ACC", "OUNT_1>"], token_ids=[1, 2, 3])
    )
    events = parse_sse(_post(server, rid, [probe], stream=True).text)
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    assert streamed == "<CARD_1> <ACCOUNT_1>"
    upstream.add(
        ScriptedTurn("Card <CARD_1> on file.")
    )  # the owner's conversation resends the card: restored
    again = _post(server, rid, [USER, {"role": "assistant", "content": f"Noted {VISA}."}, probe])
    assert again.json()["choices"][0]["message"]["content"] == f"Card {VISA} on file."


def test_every_free_text_field_is_masked_not_only_message_text(served) -> None:
    """Issue 36, Medium: a message's ``name``, the text of other content parts, tool descriptions and the
    request's ``user`` reached the engine and the store in clear."""
    server, upstream = served
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    email = "jane.doe@example.com"
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": f"Look up orders of {email}",
            "parameters": {
                "type": "object",
                "properties": {
                    "q": {"type": "string", "enum": ["a", "b"], "description": f"card like {VISA}"}
                },
            },
        },
    }
    messages = [
        {
            "role": "user",
            "name": email,
            "content": [{"type": "text", "text": "hi"}, {"type": "input_text", "text": f"mail {email}"}],
        },
    ]
    upstream.add(ScriptedTurn("ok"))
    assert _post(server, rid, messages, tools=[tool], user=email).status_code == 200
    sent = json.dumps(upstream.requests[-1].body)
    assert email not in sent and VISA not in sent, sent
    assert '"name": "lookup"' in sent and '"enum": ["a", "b"]' in sent  # names the engine matches on stay
    stored = json.dumps([s.llm.request for s in server.store.list_spans(rollout_id=rid) if s.llm])
    assert stored != "[]" and email not in stored and VISA not in stored


def test_completions_refusals_file_names_and_dialect_system_texts_are_masked(served) -> None:
    """Issue 36, Medium (M1's PARTIAL): ``/v1/completions``' ``prompt`` (a string or a list) and ``suffix``; a
    chat message's ``refusal`` and a ``file`` part's nested ``filename``; a Messages call's ``system`` and tool
    description and a Responses call's ``instructions`` and tool description reach neither the engine nor
    the store in clear."""
    import anthropic
    import openai

    server, upstream = served
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    email = "jane.doe@example.com"
    upstream.add(*[ScriptedTurn("ok") for _ in range(5)])
    base = server.rollout_base_url(rid)
    for prompt in (f"Mail {email}:", [f"Mail {email}:", "next"]):
        body = {"model": "policy", "prompt": prompt, "suffix": f" card {VISA}"}
        assert httpx.post(f"{base}/completions", json=body, timeout=30).status_code == 200
    messages = [
        {
            "role": "user",
            "content": [{"type": "file", "file": {"filename": f"{email}.pdf", "file_data": "eA=="}}],
        },
        {"role": "assistant", "content": None, "refusal": f"I cannot mail {email}"},
        {"role": "user", "content": "ok"},
    ]
    assert _post(server, rid, messages).status_code == 200
    tool = {"name": "lookup", "description": f"orders of {email}", "input_schema": {"type": "object"}}
    claude = anthropic.Anthropic(base_url=f"{server.url}/rollouts/{rid}", api_key="unused", max_retries=0)
    claude.messages.create(
        model="policy",
        max_tokens=16,
        system=f"The customer is {email}",
        tools=[tool],
        messages=[{"role": "user", "content": "hi"}],
    )
    openai.OpenAI(base_url=base, api_key="unused", max_retries=0).responses.create(
        model="policy",
        instructions=f"The customer's card is {VISA}",
        input="hi",
        tools=[{"type": "function", "name": "lookup", "description": f"orders of {email}", "parameters": {}}],
    )
    assert len(upstream.requests) == 5
    for request in upstream.requests:
        sent = json.dumps(request.body)
        assert email not in sent and VISA not in sent, sent
        assert "<EMAIL_1>" in sent or "<CARD_1>" in sent, sent
    stored = "".join(s.model_dump_json() for s in server.store.list_spans(rollout_id=rid))
    assert email not in stored and VISA not in stored


def test_other_dialects_are_masked_in_flight_too(served) -> None:
    """Issue 38 with privacy on (serve's default): a Messages or Responses call, plain or streamed (a placeholder
    split across deltas), reaches the engine and the store with placeholders and its SDK client with the values."""
    import anthropic
    import openai

    server, upstream = served
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    split = {"pieces": ["Done <CA", "RD_1", ">."], "token_ids": [7, 8, 9]}
    upstream.add(*[ScriptedTurn("Done <CARD_1>.", **split) for _ in range(4)])
    claude = anthropic.Anthropic(base_url=f"{server.url}/rollouts/{rid}", api_key="unused", max_retries=0)
    ask = [{"role": "user", "content": USER["content"]}]
    plain = claude.messages.create(model="policy", max_tokens=16, messages=ask)
    with claude.messages.stream(model="policy", max_tokens=16, messages=ask) as stream:
        streamed = stream.get_final_message()
    assert plain.content[0].text == streamed.content[0].text == f"Done {VISA}."
    responses = openai.OpenAI(
        base_url=server.rollout_base_url(rid), api_key="unused", max_retries=0
    ).responses
    assert responses.create(model="policy", input=USER["content"]).output_text == f"Done {VISA}."
    with responses.stream(model="policy", input=USER["content"]) as stream:
        assert stream.get_final_response().output_text == f"Done {VISA}."
    for request in upstream.requests:
        assert (
            request.body["messages"][-1]["content"]
            == "Charge my card <CARD_1> for account <ACCOUNT_1>, key <SECRET_1>"
        )
    spans = server.store.list_spans(rollout_id=rid)
    assert [s.attributes["dialect"] for s in spans] == ["anthropic"] * 2 + ["responses"] * 2
    stored = "".join(s.model_dump_json() for s in spans)
    assert all(value not in stored for value in (VISA, ACCOUNT, "AKIAIOSFODNN7EXAMPLE"))


def test_a_card_split_across_two_user_messages_is_masked_in_both(served) -> None:
    """Issue 36, detector bypasses: "values split across two messages" (an assistant turn between them)."""
    server, upstream = served
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    messages = [
        {"role": "user", "content": "My card is 4111 1111"},
        {"role": "assistant", "content": "Go on."},
        {"role": "user", "content": "1111 1111, thanks. I want 2"},
        {"role": "user", "content": "3 boxes"},  # two numbers that make no value together stay as they are
    ]
    upstream.add(ScriptedTurn("Charged <CARD_1>."))
    answer = _post(server, rid, messages).json()["choices"][0]["message"]
    assert answer["content"] == "Charged 4111 1111 1111 1111."
    sent = [m["content"] for m in upstream.requests[-1].body["messages"]]
    assert sent == ["My card is <CARD_1>", "Go on.", "<CARD_1>, thanks. I want 2", "3 boxes"]
    (span,) = server.store.list_spans(rollout_id=rid)
    assert "4111" not in span.model_dump_json() and "1111 1111" not in span.model_dump_json()
    assert span.attributes["privacy"]["redactions"] == {"CARD": 1}


def _dialect_events(text: str) -> list[dict]:
    """The ``data:`` objects of a dialect's SSE stream (``event:`` lines name their type again)."""
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


@pytest.mark.parametrize("dialect", ["responses", "messages"])
def test_a_dialect_stream_gets_the_values_back_split_placeholders_too(served, dialect: str) -> None:
    """A streamed Responses / Messages call whose answer holds a placeholder (split over three deltas): the
    client's dialect events carry the real value (privacy's restore runs on the chat stream, then the dialect's
    translation reads it back: the byte-level path of ``dialect_io.translate_response``)."""
    server, upstream = served
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    upstream.add(ScriptedTurn("Done <CARD_1>.", pieces=["Done <CA", "RD_1", ">."], token_ids=[7, 8, 9]))
    base = server.rollout_base_url(rid)
    if dialect == "responses":
        body = {"model": "policy", "input": USER["content"], "stream": True}
        events = _dialect_events(httpx.post(f"{base}/responses", json=body, timeout=30).text)
        text = "".join(e["delta"] for e in events if e.get("type") == "response.output_text.delta")
    else:
        body = {"model": "policy", "max_tokens": 32, "messages": [USER], "stream": True}
        events = _dialect_events(httpx.post(f"{base}/messages", json=body, timeout=30).text)
        text = "".join(e["delta"].get("text", "") for e in events if e.get("type") == "content_block_delta")
    assert text == f"Done {VISA}.", events
    assert (
        "<CARD_1>" in upstream.requests[-1].body["messages"][0]["content"]
    )  # the engine saw the placeholder


def test_a_gateway_built_without_a_policy_masks_and_off_is_said_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 36: privacy is on wherever a gateway is built (``create_gateway``, ``GatewayServer``, ``LocalStack``),
    not only under ``agentforge serve``; turning it off takes an explicit ``mode="off"``, which is logged."""
    import logging

    for config, sent in ((None, "<CARD_1>"), (PrivacyConfig(mode=PrivacyMode.off), VISA)):
        store, upstream = memory_store(), ScriptedUpstream([ScriptedTurn("ok")])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="agentforge.gateway"):
            kwargs = {} if config is None else {"privacy": config}
            with GatewayServer(store, upstream.router(), transport=upstream.transport(), **kwargs) as server:
                rid = store.enqueue_rollout(Rollout()).rollout_id
                assert _post(server, rid, [{"role": "user", "content": f"card {VISA}"}]).status_code == 200
        assert upstream.requests[-1].body["messages"][0]["content"] == f"card {sent}"
        (span,) = store.list_spans(rollout_id=rid)
        assert (VISA in span.model_dump_json()) is (config is not None)
        warned = [r.getMessage() for r in caplog.records if "privacy off" in r.getMessage()]
        assert len(warned) == (0 if config is None else 1)
        store.close()


def test_the_gateway_serves_while_its_detectors_are_built_and_the_first_call_waits_for_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The detectors' build (Presidio's import: 6-25 s on 2 cores) runs in a background thread: a gateway is up
    and answers ``/health`` at once; a call that arrives first waits for the build off the event loop and is
    masked like every other."""
    import threading

    from agentforge.privacy import flight

    started, release = threading.Event(), threading.Event()
    real = flight.Detector

    def slow(config: PrivacyConfig):  # the build, held until the test lets it finish
        started.set()
        assert release.wait(60), "the test never released the build"
        return real(config)

    monkeypatch.setattr(flight, "Detector", slow)
    policy = PrivacyConfig(patterns={"SLOWBUILD": r"SLOW-\d{4}"})  # a policy of its own: not yet built
    store, upstream = memory_store(), ScriptedUpstream([ScriptedTurn("ok")])
    with GatewayServer(store, upstream.router(), transport=upstream.transport(), privacy=policy) as server:
        assert started.wait(30)
        rid = store.enqueue_rollout(Rollout()).rollout_id
        result: dict[str, httpx.Response] = {}
        call = threading.Thread(
            target=lambda: result.setdefault(
                "r", _post(server, rid, [{"role": "user", "content": "SLOW-1234"}])
            )
        )
        call.start()
        try:
            for _ in range(3):
                assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
            assert "r" not in result and upstream.requests == []  # the call waits for the detectors
        finally:
            release.set()
            call.join(60)
        assert result["r"].status_code == 200
        assert upstream.requests[-1].body["messages"][0]["content"] == "<SLOWBUILD_1>"
    store.close()


def test_a_missing_detection_library_is_named_when_the_gateway_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    from agentforge.errors import MissingExtraError
    from agentforge.privacy import flight

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "phonenumbers" else real(name, *a)
    )
    with pytest.raises(MissingExtraError, match="phonenumbers"):
        flight.PrivacyGuard(PrivacyConfig(patterns={"NEVERBUILT": r"NB-\d{4}"}))


def test_the_reported_400_kb_body_leaves_the_gateway_answering(served) -> None:
    """Issue 36, High 2, as the report ran it (public surfaces only, so it also runs on the tree the issue was
    filed on: ``scripts/tests_at_commit.sh 52048a9 <this test>``, where /health was held for 15.8 s): a 400 KB
    body of ``"4111 "`` in mask mode at the default policy. /health answers within a second all the while, and
    the call is refused with a 413 (its estimated scan is over ``max_scan_s``), forwarded and stored nowhere."""
    import threading
    import time

    server, upstream = served
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    result: dict[str, httpx.Response] = {}
    call = threading.Thread(
        target=lambda: result.setdefault(
            "call", _post(server, rid, [{"role": "user", "content": "4111 " * 80_000}])
        )
    )
    call.start()
    waits = []
    while call.is_alive() or not waits:
        began = time.perf_counter()
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        waits.append(time.perf_counter() - began)
        time.sleep(0.02)
    call.join()
    assert max(waits) < 1.0, waits
    assert result["call"].status_code == 413, result["call"].text
    assert upstream.requests == [] and server.store.list_spans(rollout_id=rid) == []


@pytest.mark.parametrize("mode", [PrivacyMode.mask, PrivacyMode.redact])
def test_a_request_whose_scan_would_run_for_minutes_is_refused_with_a_413_and_nothing_stored(
    mode: PrivacyMode,
) -> None:
    """Issue 36, High 2: detection's cost grows with the digits of a body (the phone detector tries every window
    of a digit run): a 4 MiB body of ``"4111 "`` would hold a scan thread for minutes. A request whose estimated
    scan is over ``max_scan_s`` is refused with a 413 naming the limit, never forwarded or stored; a conversation
    under it is served and masked as before; the limit is the policy's to raise."""
    store, upstream = memory_store(), ScriptedUpstream([ScriptedTurn("ok")])
    policy = PrivacyConfig(mode=mode, max_scan_s=1.0)
    with GatewayServer(store, upstream.router(), transport=upstream.transport(), privacy=policy) as server:
        rid = store.enqueue_rollout(Rollout()).rollout_id
        hostile = {"role": "user", "content": "4111 " * 20_000}  # 100 KB, 80,000 digits: ~3.2 s estimated
        refused = _post(server, rid, [hostile])
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert error["code"] == "request_too_large" and "max_scan_s=1 s" in error["message"]
        assert upstream.requests == [] and store.list_spans() == []
        if mode is PrivacyMode.mask:  # the SDKs of the other dialects get their own typed error
            import anthropic
            import openai

            claude = anthropic.Anthropic(
                base_url=f"{server.url}/rollouts/{rid}", api_key="unused", max_retries=0
            )
            with pytest.raises(anthropic.APIStatusError, match="max_scan_s") as refused_messages:
                claude.messages.create(model="policy", max_tokens=16, messages=[hostile])
            assert refused_messages.value.status_code == 413
            client = openai.OpenAI(base_url=server.rollout_base_url(rid), api_key="unused", max_retries=0)
            with pytest.raises(openai.APIStatusError, match="max_scan_s") as refused_responses:
                client.responses.create(model="policy", input=hostile["content"])
            assert refused_responses.value.status_code == 413
            assert upstream.requests == [] and store.list_spans() == []
        fine = _post(server, rid, [{"role": "user", "content": f"card {VISA}"}])
        assert fine.status_code == 200 and len(store.list_spans(rollout_id=rid)) == 1
    store.close()
    with pytest.raises(UserError, match="max_scan_s"):
        PrivacyConfig(max_scan_s=0)
