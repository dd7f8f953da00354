"""TRL's reward-function shape, and reading the text out of what TRL calls a *completion*.

A reward function (:data:`RewardFunc`) is ``f(completions, **kwargs) -> list[float | None]``: one entry per
completion, ``None`` for one that cannot be scored (masked and counted by the trainer, never 0). TRL passes
``completions`` in one of two shapes: plain strings (standard format) or, for conversational data, a list of
OpenAI-style messages per completion (``[{"role": "assistant", "content": "..."}]``). Agent rollouts use the
second shape for a whole episode, where tool results and user turns sit between the assistant turns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["RewardFunc", "message_text", "agent_texts", "completion_text"]

#: TRL's reward-function shape: ``f(completions, **kwargs) -> list[float | None]`` (``None``: cannot be scored).
RewardFunc = Callable[..., list[float | None]]


def message_text(content: Any) -> str | None:
    """Return the text of one message's ``content``.

    Args:
        content: a string, ``None`` (a pure tool-call turn), or a list of content parts
            (``{"type": "text", "text": ...}``; other part types are skipped).

    Returns:
        The text (parts joined with newlines), or ``None`` when there is no text.
    """
    if content is None:
        return None
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [text for p in content if isinstance(p, Mapping) and isinstance(text := p.get("text"), str)]
        return "\n".join(parts) if parts else None
    return None


def agent_texts(messages: str | Sequence[Any] | None) -> list[str] | None:
    """Return the texts the agent said: every assistant message's text, in order.

    Args:
        messages: one string (taken as a single agent message), or a sequence whose items are strings
            (each an agent message) or message dicts (only ``role == "assistant"`` counts; a dict without
            ``role`` counts as assistant).

    Returns:
        The agent's texts, or ``None`` when ``messages`` has an unsupported type (cannot be scored).
    """
    if messages is None:
        return None
    if isinstance(messages, str):
        return [messages]
    if isinstance(messages, Mapping):
        messages = [messages]
    if not isinstance(messages, Sequence):
        return None
    texts = []
    for message in messages:
        if isinstance(message, str):
            texts.append(message)
        elif isinstance(message, Mapping):
            if message.get("role", "assistant") != "assistant":
                continue
            text = message_text(message.get("content"))
            if text is not None:
                texts.append(text)
        else:
            return None
    return texts


def completion_text(completion: str | Sequence[Any] | None) -> str | None:
    """Return one completion's assistant text (assistant turns joined with newlines).

    Args:
        completion: a string or a list of messages (see :func:`agent_texts`).

    Returns:
        The text, or ``None`` when the completion has an unsupported type.
    """
    texts = agent_texts(completion)
    return None if texts is None else "\n".join(texts)
