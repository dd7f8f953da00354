"""Which distribution a span's stored log-probabilities describe, and whether the trainer can recompute it.

GRPO's importance-sampling correction (TRL's ``vllm_importance_sampling_correction``) divides the trainer's
probability of each sampled token by the engine's stored one. The two must describe the same distribution or
the ratio measures the difference of settings, not of weights: agents choose their own temperatures, and
engines return log-probabilities either of the raw model (``raw_logprobs``, vLLM's default and the embedded
engine's: log-softmax of the logits, before temperature and truncation) or of the distribution they sampled
from (``processed_logprobs``: after penalties, temperature, ``min_p``, ``top_k`` / ``top_p``; vLLM's
``--logprobs-mode``, TRL's recommendation for this correction).

The gateway records the serving engine's mode on every LLM span (``span.attributes["logprobs_mode"]``, from
the upstream serving registered); the span's request holds the sampling settings. :func:`stored_logprob_
temperature` turns both into the one temperature the trainer recomputes that span's tokens at, or a reason
it cannot:

* ``processed_logprobs``: the span's temperature (its request's; 1.0 when the request sets none);
* ``raw_logprobs`` (or no mode recorded: both engines' default): 1.0, and only for spans sampled at
  temperature 1.0 — at any other temperature the stored values describe the temperature-1 distribution, not
  the one the tokens were drawn from, so no recomputation matches both;
* never: another mode (``raw_logits`` / ``processed_logits`` are not log-probabilities), greedy decoding
  (temperature 0: no sampling distribution), settings the trainer's log-softmax does not reproduce
  (``top_p`` < 1, ``top_k`` > 0, ``min_p`` > 0, penalties, ``logit_bias``), or a guided call whose logprobs
  are still the grammar-masked ones (flag ``guided_logprobs_not_recomputed``). A guided call whose logprobs
  the gateway recomputed (``guided_logprobs_recomputed``: the engine's prompt logprobs) counts as raw.

**Explored samples** (``explored=True``, :class:`~agentforge.trainers.grpo_config.TrainConfig`'s
``explored_samples="train"``): a raw-logprob span sampled with other settings than temperature 1 (an agent
exploring its tool decision at ``T > 1`` or with ``min_p``, a greedy reply after it; a guided call's
recomputed logprobs are always raw) is matched at 1.0 and trains as a sample of the temperature-1 policy. This is exploration without an importance correction for the
temperature: the stored and recomputed values still agree (both temperature 1), so the correction keeps
guarding against weight drift, but the sample was drawn from a hotter distribution than the one trained. Its
advantage still decides the sign of its push; the bias favours the explored samples, as sampling at a higher
temperature than one trains at does in practice (e.g. DAPO's T = 1.0 rollouts of a policy served greedily).

A trajectory with a span that cannot be matched is excluded from training and counted under
``batch/skipped_unmatched_logprobs`` (the reasons are logged), never silently down-weighted by a ratio that
compares two different distributions.
"""

from __future__ import annotations

import math
from typing import Any

from agentforge.types import LOGPROBS_MODE_ATTRIBUTE, LOGPROBS_MODES, Span

__all__ = [
    "LOGPROBS_MODES",
    "LOGPROBS_MODE_ATTRIBUTE",
    "PROCESSED_LOGPROBS",
    "RAW_LOGPROBS",
    "stored_logprob_temperature",
]

#: Log-softmax of the raw logits, before any processing (vLLM's default, the embedded engine's default).
RAW_LOGPROBS, PROCESSED_LOGPROBS = LOGPROBS_MODES
#: Flags of guided calls (``agentforge.gateway.guided``): logprobs replaced by the engine's prompt logprobs (raw,
#: unconstrained), or left grammar-masked because that recomputation failed.
GUIDED_RECOMPUTED, GUIDED_NOT_RECOMPUTED = "guided_logprobs_recomputed", "guided_logprobs_not_recomputed"


def _distortions(sampling: dict[str, Any]) -> list[str]:
    """The sampling settings that make the sampled distribution more than a tempered softmax."""
    out = []
    checks = (
        ("top_p", lambda v: float(v) < 1.0),
        ("top_k", lambda v: int(v) > 0),
        ("min_p", lambda v: float(v) > 0.0),
        ("presence_penalty", lambda v: float(v) != 0.0),
        ("frequency_penalty", lambda v: float(v) != 0.0),
        ("repetition_penalty", lambda v: float(v) != 1.0),
        ("logit_bias", lambda v: bool(v)),
    )
    for key, active in checks:
        value = sampling.get(key)
        try:
            distorts = value is not None and active(value)
        except (TypeError, ValueError):  # not a number: the engine's reading of it is unknown
            distorts = True
        if distorts:
            out.append(f"{key}={value}")
    return out


def stored_logprob_temperature(span: Span, *, explored: bool = False) -> tuple[float | None, str | None]:
    """The temperature at which the trainer reproduces ``span``'s stored log-probabilities (module docstring).

    Args:
        span: an LLM span as the gateway recorded it.
        explored: match a raw-logprob span sampled with any settings at 1.0 (explored samples, module
            docstring) instead of refusing one not sampled at temperature 1 without truncation.

    Returns:
        ``(temperature, None)`` when the trainer can recompute the span's stored log-probabilities, else
        ``(None, reason)``, a sentence naming the mode or setting it cannot match.
    """
    llm = span.llm
    request: dict[str, Any] = {}
    if llm is not None:
        request = {**llm.request, **llm.sampling}
    flags = llm.flags if llm is not None else []
    if GUIDED_NOT_RECOMPUTED in flags:
        return (
            None,
            "its logprobs are the grammar-masked ones of a guided call, which the trainer does not mask",
        )
    mode = span.attributes.get(LOGPROBS_MODE_ATTRIBUTE) or RAW_LOGPROBS
    if GUIDED_RECOMPUTED in flags:  # the gateway replaced them by the engine's prompt logprobs: raw
        mode = RAW_LOGPROBS
    if mode not in LOGPROBS_MODES:
        return None, f"the engine returned {mode!r}, which are not log-probabilities of the sampled tokens"
    if explored and mode == RAW_LOGPROBS:  # raw values are the temperature-1 ones however it sampled
        return 1.0, None
    raw = request.get("temperature")
    try:
        temperature = 1.0 if raw is None else float(raw)
    except (TypeError, ValueError):
        return None, f"temperature {raw!r} is not a number"
    if not math.isfinite(temperature) or temperature <= 0:
        return (
            None,
            f"sampled at temperature {raw} (greedy): there is no sampling distribution to correct against",
        )
    distortions = _distortions(request)
    if distortions:
        return (
            None,
            f"sampled with {', '.join(distortions)}, which the trainer's log-softmax does not reproduce",
        )
    if mode == RAW_LOGPROBS and temperature != 1.0:
        return None, (
            f"sampled at temperature {temperature} by an engine returning raw_logprobs (the temperature-1 "
            "distribution, not the one sampled from); serve with logprobs_mode='processed_logprobs'"
        )
    return (temperature if mode == PROCESSED_LOGPROBS else 1.0), None
