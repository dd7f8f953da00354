"""What the model writes: personal data in an answer is masked in the stored call as it is in a request.

In ``mask`` mode the engine sees placeholders, never a value a client sent. The model can still write a value
of its own (an address it made up or remembered from training). The client gets the answer as the model wrote
it; the stored call, and what the engine is shown when the conversation continues token-exactly
(:mod:`agentforge.gateway.prefix`), carry placeholders instead: the value joins the rollout's mapping, so the
client's echo of the answer on its next call is masked to the same placeholder and the conversation stays one
trajectory (issue 36, "personal data the model itself writes").

The stored completion ids are re-tokenised from the masked answer: the engine's ``/detokenize`` of the sampled
ids, masked with the rollout's mapping, then its ``/tokenize``. The longest head these ids share with the
sampled ones is what the policy sampled: those tokens keep their logprobs and train. From the first difference
on the tokens are not the policy's samples (a placeholder it never wrote, then tokens it sampled after a value
the store does not hold), so ``attributes[UNSAMPLED_FROM]`` holds that index, their logprobs are 0.0, and the
trainer gives them ``env_mask`` 0 (:func:`agentforge.trainers.samples.build_trajectories`). Without an engine that
can (de)tokenise, the ids and logprobs are withheld and the call is not trainable (flag :data:`ANSWER_WITHHELD`):
the store never holds the value in any form.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Protocol

from agentforge.privacy.mapping import Mapping
from agentforge.types import LLMCall

__all__ = [
    "ANSWER_MASKED",
    "ANSWER_WITHHELD",
    "UNSAMPLED_FROM",
    "EngineTokens",
    "answer_ids",
    "answer_texts",
    "mask_answer_text",
]

#: Flag: the model wrote personal data; the stored completion ids spell the masked answer (see the module doc).
ANSWER_MASKED = "privacy_answer_masked"
#: Flag (and ``not_trainable_reason``): the model wrote personal data and no engine could re-tokenise the masked
#: answer, so the call's ids and logprobs were withheld.
ANSWER_WITHHELD = "privacy_answer_withheld"
#: Span attribute: the index of the first stored completion token the policy did not sample (``int``, 0..C).
UNSAMPLED_FROM = "privacy_unsampled_from"


class EngineTokens(Protocol):
    """The serving engine's tokenizer, as vLLM's ``/detokenize`` and ``/tokenize`` routes offer it."""

    async def detokenize(self, ids: list[int]) -> str | None:
        """The text of ``ids`` (special tokens kept), or ``None`` when the engine cannot say."""
        ...

    async def tokenize(self, text: str) -> list[int] | None:
        """The ids of ``text`` (no special tokens added), or ``None`` when the engine cannot say."""
        ...


def answer_texts(llm: LLMCall) -> list[str]:
    """The free text of an answer a person's data can be in: its text and each tool call's arguments (JSON)."""
    return [llm.response_text, *(c.arguments for c in llm.tool_calls)]


def mask_answer_text(mapping: Mapping, llm: LLMCall) -> tuple[LLMCall, Counter[str]]:
    """``llm`` with its answer text and tool-call arguments masked with ``mapping`` (new values join it).

    Args:
        mapping: the rollout's placeholders (held locked by the caller).
        llm: the call as the engine answered it.

    Returns:
        The masked call (ids unchanged: :func:`answer_ids` rewrites them) and the replacements per category.
    """
    counts: Counter[str] = Counter()
    text, found = mapping.mask(llm.response_text)
    counts.update(found)
    calls = []
    for call in llm.tool_calls:
        arguments, found = mapping.mask(call.arguments)
        counts.update(found)
        if not found:
            calls.append(call)
            continue
        try:
            parsed = json.loads(arguments) if call.parsed is not None else None
        except ValueError:
            parsed = None
        calls.append(call.model_copy(update={"arguments": arguments, "parsed": parsed}))
    return llm.model_copy(update={"response_text": text, "tool_calls": calls}), counts


def _common_head(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


async def answer_ids(
    masked: LLMCall,
    sampled: LLMCall,
    mask: Callable[[str], Awaitable[tuple[str, Counter[str]]]],
    tokens: EngineTokens | None,
) -> tuple[LLMCall, dict[str, int | str]]:
    """The stored ids of an answer in which the model wrote personal data (see the module docstring).

    Args:
        masked: the call with its text masked (:func:`mask_answer_text`).
        sampled: the call as the engine answered it (the sampled ids, ``(C,)``, and their logprobs).
        mask: masks a text with the rollout's mapping (which already holds the values the answer's text carried;
            the caller decides where the scan runs).
        tokens: the engine that served the call, or ``None`` (no engine can re-tokenise).

    Returns:
        ``(call to store, span attributes)``: ids re-tokenised with ``{UNSAMPLED_FROM: n}``, or ids and
        logprobs withheld with ``{"not_trainable_reason": ANSWER_WITHHELD}``.
    """
    ids = sampled.completion_token_ids
    if ids is None:
        return masked, {}
    rewritten = None
    if tokens is not None:
        raw = await tokens.detokenize(list(ids))
        if raw is not None:
            text, found = await mask(raw)
            # the values are in the sampled text as the engine decodes it: re-tokenise the masked one
            if found:
                rewritten = await tokens.tokenize(text)
    if not rewritten:
        withheld = {"completion_token_ids": None, "logprobs": None, "trainable": False}
        flags = [*masked.flags, ANSWER_WITHHELD]
        return masked.model_copy(update={**withheld, "flags": flags}), {
            "not_trainable_reason": ANSWER_WITHHELD
        }
    n = _common_head(rewritten, list(ids))
    logprobs = None
    if sampled.logprobs is not None:
        logprobs = [*sampled.logprobs[:n], *[0.0] * (len(rewritten) - n)]
    update = {
        "completion_token_ids": rewritten,
        "logprobs": logprobs,
        "flags": [*masked.flags, ANSWER_MASKED],
    }
    return masked.model_copy(update=update), {UNSAMPLED_FROM: n}
