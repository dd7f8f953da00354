"""Which spans' stored logprobs the trainer can recompute, and at which temperature (``logprob_match``).

Guards against: a span's own temperature ignored (processed logprobs recomputed at the configured one); raw
logprobs sampled at another temperature, or with truncation / penalties, or greedily, treated as matching;
an unknown engine mode (``*_logits``) read as log-probabilities.
"""

from __future__ import annotations

import pytest

from agentforge.gateway import guided as gateway_guided
from agentforge.trainers.logprob_match import (
    GUIDED_NOT_RECOMPUTED,
    GUIDED_RECOMPUTED,
    stored_logprob_temperature,
)
from agentforge.types import LLMCall, Span, SpanKind


def _span(mode: str | None, flags: tuple[str, ...] = (), **request: object) -> Span:
    attributes = {"logprobs_mode": mode} if mode else {}
    return Span(
        kind=SpanKind.llm, llm=LLMCall(request=dict(request), flags=list(flags)), attributes=attributes
    )


@pytest.mark.parametrize(
    ("mode", "request_", "temperature"),
    [
        ("processed_logprobs", {"temperature": 0.7}, 0.7),
        ("processed_logprobs", {"temperature": 1.3, "top_p": 1.0, "top_k": -1}, 1.3),
        ("processed_logprobs", {}, 1.0),  # no temperature in the request: the OpenAI default 1.0
        ("raw_logprobs", {"temperature": 1.0}, 1.0),
        (None, {"temperature": 1}, 1.0),  # no mode recorded: both engines' default, raw
    ],
)
def test_matching_spans_give_the_temperature_to_recompute_at(mode, request_, temperature) -> None:  # type: ignore[no-untyped-def]
    assert stored_logprob_temperature(_span(mode, **request_)) == (temperature, None)


@pytest.mark.parametrize(
    ("mode", "request_", "why"),
    [
        ("raw_logprobs", {"temperature": 0.7}, "raw_logprobs"),
        (None, {"temperature": 1.3}, "raw_logprobs"),
        ("processed_logprobs", {"temperature": 0.0}, "greedy"),
        ("processed_logprobs", {"temperature": 0.7, "top_p": 0.9}, "top_p=0.9"),
        ("processed_logprobs", {"top_k": 20}, "top_k=20"),
        ("processed_logprobs", {"presence_penalty": 0.5}, "presence_penalty"),
        ("processed_logprobs", {"logit_bias": {"42": 5}}, "logit_bias"),
        ("processed_logprobs", {"temperature": "hot"}, "not a number"),
        ("raw_logits", {"temperature": 1.0}, "not log-probabilities"),
    ],
)
def test_spans_the_trainer_cannot_match_say_why(mode, request_, why) -> None:  # type: ignore[no-untyped-def]
    temperature, reason = stored_logprob_temperature(_span(mode, **request_))
    assert temperature is None and reason is not None and why in reason, reason


def test_guided_calls_are_matched_by_what_the_gateway_stored() -> None:
    """Recomputed guided logprobs are the engine's prompt logprobs (raw); grammar-masked ones never match."""
    assert (GUIDED_RECOMPUTED, GUIDED_NOT_RECOMPUTED) == (
        gateway_guided.GUIDED_RECOMPUTED,
        gateway_guided.GUIDED_NOT_RECOMPUTED,
    )
    recomputed = (GUIDED_RECOMPUTED,)
    assert stored_logprob_temperature(_span("processed_logprobs", recomputed, tool_choice="required")) == (
        1.0,
        None,
    )
    assert stored_logprob_temperature(_span("processed_logprobs", recomputed, temperature=0.7))[0] is None
    temperature, why = stored_logprob_temperature(_span("processed_logprobs", (GUIDED_NOT_RECOMPUTED,)))
    assert temperature is None and "grammar-masked" in str(why)


def test_explored_raw_spans_train_as_temperature_one_samples_and_nothing_else_loosens() -> None:
    """``explored=True`` (TrainConfig.explored_samples="train"): a raw-logprob span sampled hot, with min_p or
    greedily (a capture's explored tool decision and greedy reply; a guided call's recomputed logprobs are raw)
    matches at 1.0; processed spans keep their own rules and unrecomputed guided calls stay refused."""
    hot = _span("raw_logprobs", (GUIDED_RECOMPUTED,), temperature=1.5)
    assert stored_logprob_temperature(hot)[0] is None
    assert stored_logprob_temperature(hot, explored=True) == (1.0, None)
    for raw in (
        _span(None, temperature=0.7),
        _span("raw_logprobs", temperature=0.0),
        _span("raw_logprobs", temperature=2.0, min_p=0.2),
    ):
        assert stored_logprob_temperature(raw, explored=True) == (1.0, None)
    assert stored_logprob_temperature(_span("processed_logprobs", temperature=1.5), explored=True) == (
        1.5,
        None,
    )
    for still_refused in (
        _span("processed_logprobs", temperature=0.0),
        _span("processed_logprobs", temperature=1.5, min_p=0.2),
        _span("raw_logprobs", (GUIDED_NOT_RECOMPUTED,), temperature=1.5),
        _span("raw_logits", temperature=1.0),
    ):
        assert stored_logprob_temperature(still_refused, explored=True)[0] is None
