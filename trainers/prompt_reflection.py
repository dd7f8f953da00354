"""The reflection side of prompt optimisation: the reflection LM endpoint, its prompt, and feedback.

GEPA (Agrawal et al. 2025, "GEPA: Reflective Prompt Evolution Can Outperform Reinforcement Learning",
arXiv:2507.19457) proposes a new prompt by showing a *reflection LM* the current prompt and, per example,
the input, the model's output and textual feedback. :class:`ReflectionLM` is any OpenAI-compatible chat
endpoint (a hosted model, or the local policy through the agentforge gateway); :data:`REFLECTION_TEMPLATE`
is written to give a small model its best chance; :func:`label_feedback` writes the feedback of
exact-match label tasks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentforge.errors import ConfigError
from agentforge.types import Task

__all__ = ["REFLECTION_TEMPLATE", "Feedback", "ReflectionLM", "label_feedback"]

#: The reflection prompt (GEPA placeholders ``<curr_param>``, ``<side_info>``): short and direct, so a
#: small model can follow it; GEPA's own default template is ~2x longer and written for frontier models.
REFLECTION_TEMPLATE = """Here is how an assistant did on some examples:
<side_info>

The assistant's instruction was:
```
<curr_param>
```

Write a better instruction for the assistant: say what to answer, and copy the list of allowed answers \
from the feedback into it. Reply with only the new instruction, between ``` marks."""


#: Feedback writer: ``(task, model_output, score) -> str`` shown to the reflection LM for one example.
Feedback = Callable[[Task, str, float], str]


@dataclass
class ReflectionLM:
    """An OpenAI-compatible chat endpoint used as GEPA's reflection LM (a gepa ``LanguageModel``).

    Attributes:
        base_url: the API root including ``/v1`` (a hosted model, or ``{gateway}/v1`` for the local one).
        model: the model name (``"policy"`` through an agentforge gateway).
        api_key: the key, if the endpoint needs one.
        max_tokens: completion budget of one reflection, tokens.
        temperature: sampling temperature (some diversity helps GEPA propose different candidates; a
            small local model copies facts from the feedback far more often greedy. Measured on
            SmolLM2-135M with :data:`REFLECTION_TEMPLATE`, reflections on 6 Bitext examples that copied
            at least 6 of the 11 allowed labels: 6/12 at 0.0, 3/12 at 0.3; at 0.7, 0/12 on 3 or 8 examples).
        template: the reflection prompt (must contain ``<curr_param>`` and ``<side_info>``).
        prefill: start of the answer, sent as an assistant prefill (vLLM ``continue_final_message``; not
            for hosted APIs). ``"```\\n"`` with ``stop=["```"]`` makes a small model write only the text.
        stop: stop sequences.
        timeout_s: request timeout, seconds.
        calls: every call made: ``{"output", "latency_s", "error"}`` (filled while optimising).
    """

    base_url: str
    model: str = "policy"
    api_key: str | None = None
    max_tokens: int = 256
    temperature: float = 0.7
    template: str = REFLECTION_TEMPLATE
    prefill: str | None = None
    stop: list[str] | None = None
    timeout_s: float = 120.0
    calls: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or not 0.0 <= self.temperature <= 2.0:
            raise ConfigError(
                f"ReflectionLM: max_tokens={self.max_tokens} must be >= 1 and temperature={self.temperature} "
                "in [0, 2]"
            )
        missing = [p for p in ("<curr_param>", "<side_info>") if p not in self.template]
        if missing:
            raise ConfigError(f"ReflectionLM.template lacks the placeholder(s) {missing}")

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        """One reflection: send ``prompt`` as the user message and return the answer text.

        Raises:
            httpx.HTTPError: the endpoint failed (GEPA skips that proposal and goes on).
        """
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        if self.stop:
            body["stop"] = self.stop
        if self.prefill:
            body["messages"] = [*messages, {"role": "assistant", "content": self.prefill}]
            body.update(continue_final_message=True, add_generation_prompt=False)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        t0 = time.monotonic()
        try:
            resp = httpx.post(
                f"{self.base_url.rstrip('/')}/chat/completions",
                json=body,
                headers=headers,
                timeout=self.timeout_s,
            )
            resp.raise_for_status()
            text = resp.json()["choices"][0]["message"].get("content") or ""
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            self.calls.append({"output": "", "latency_s": time.monotonic() - t0, "error": repr(exc)})
            raise
        if self.prefill:
            text = self.prefill + text + ("```" if self.prefill.startswith("```") else "")
        self.calls.append({"output": text, "latency_s": time.monotonic() - t0, "error": None})
        return text


def label_feedback(labels: Sequence[str] | None = None, label_key: str = "label") -> Feedback:
    """Feedback for exact-match label tasks: the gold label, whether the output matched, and the vocabulary.

    Args:
        labels: the allowed labels, listed in every feedback on a wrong answer (``None``: not listed).
        label_key: where the gold label is in ``task.metadata``.

    Returns:
        A :data:`Feedback` function.
    """
    vocabulary = f" The answer must be exactly one of: {', '.join(labels)}." if labels else ""

    def feedback(task: Task, output: str, score: float) -> str:
        gold = task.metadata.get(label_key)
        if score >= 1.0:
            return f"Correct: the answer is '{gold}'."
        return f"Wrong: the assistant answered {output.strip()!r} but the correct answer is '{gold}'.{vocabulary}"

    return feedback
