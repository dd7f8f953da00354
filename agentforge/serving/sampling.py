"""The sampling parameters an OpenAI-style request may carry, checked the way vLLM checks them (a 400 that
names the parameter, never a 500 or a misleading message from deeper down)."""

from __future__ import annotations

import math
from typing import Any, TypeGuard

__all__ = ["sampling_problem"]


def sampling_problem(body: dict[str, Any], chat: bool) -> str | None:
    """What is wrong with a request's sampling parameters, in vLLM's terms, else ``None``.

    Checked: ``max_tokens`` / ``max_completion_tokens`` (integers ≥ 1), ``temperature`` (a finite number
    ≥ 0), ``top_p`` (in (0, 1]), ``n`` (1 here), ``seed`` (an integer), ``logprobs`` (a boolean on chat,
    an integer 0-20 on completions), ``top_logprobs`` (an integer 0-20), ``stream`` (a boolean).
    """

    def integer(value: Any) -> TypeGuard[int]:
        return isinstance(value, int) and not isinstance(value, bool)

    def number(value: Any) -> bool:
        return (integer(value) or isinstance(value, float)) and math.isfinite(value)

    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and not (integer(value) and value >= 1):
            return f"{name} must be an integer of at least 1, got {value!r}"
    checks: list[tuple[str, Any, bool, str]] = [
        (
            "temperature",
            body.get("temperature"),
            number(body.get("temperature")) and body.get("temperature", 0) >= 0,
            "a finite number of at least 0",
        ),
        (
            "top_p",
            body.get("top_p"),
            number(body.get("top_p")) and 0 < body.get("top_p", 1) <= 1,
            "a number in (0, 1]",
        ),
        (
            "n",
            body.get("n"),
            integer(body.get("n")) and body.get("n") == 1,
            "1 (the embedded server samples one)",
        ),
        ("seed", body.get("seed"), integer(body.get("seed")), "an integer"),
        (
            "top_logprobs",
            body.get("top_logprobs"),
            integer(body.get("top_logprobs")) and 0 <= body.get("top_logprobs", 0) <= 20,
            "an integer from 0 to 20",
        ),
        ("stream", body.get("stream"), isinstance(body.get("stream"), bool), "true or false"),
    ]
    logprobs = body.get("logprobs")
    if chat:
        checks.append(("logprobs", logprobs, isinstance(logprobs, bool), "true or false"))
    else:
        checks.append(
            ("logprobs", logprobs, integer(logprobs) and 0 <= logprobs <= 20, "an integer from 0 to 20")
        )
    for name, value, ok, want in checks:
        if value is not None and not ok:
            return f"{name} must be {want}, got {value!r}"
    return None
