"""The script a :class:`~agentforge.testing.ScriptedUpstream` answers from: turns, tool calls, errors, and the
deterministic fake token ids used when a turn gives none."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ScriptedError",
    "ScriptedRequest",
    "ScriptedToolCall",
    "ScriptedTurn",
    "fake_token_ids",
    "split_text",
]


def fake_token_ids(text: str) -> list[int]:
    """Deterministic fake ids: one per 4-character piece of ``text``, in ``[1000, 49000)``."""
    return [
        1000 + zlib.crc32(text[i : i + 4].encode("utf-8", "surrogatepass")) % 48000
        for i in range(0, len(text), 4)
    ]


def split_text(text: str, n: int) -> list[str]:
    """``text`` cut into ``n`` consecutive pieces (some empty when ``n > len(text)``)."""
    if n <= 0:
        return []
    step, extra = divmod(len(text), n)
    out, pos = [], 0
    for i in range(n):
        size = step + (1 if i < extra else 0)
        out.append(text[pos : pos + size])
        pos += size
    return out


@dataclass
class ScriptedToolCall:
    """A tool call in a scripted turn.

    Attributes:
        name: the tool's name.
        arguments: the raw argument string, sent exactly as given (``""``, malformed JSON... allowed).
        id: the call id (default ``call_<turn>_<index>``).
        token_ids: ids of the call's tokens (default: fake ids of ``name + arguments``, at least one).
    """

    name: str
    arguments: str = "{}"
    id: str | None = None
    token_ids: list[int] | None = None

    def ids(self) -> list[int]:
        """The call's token ids."""
        return (
            list(self.token_ids)
            if self.token_ids is not None
            else fake_token_ids(f"<tool_call>{self.name} {self.arguments}")
        )


@dataclass
class ScriptedError:
    """An error answer.

    Attributes:
        status: HTTP status (ignored when ``in_stream``).
        message: the error message.
        type: the error type (vLLM uses e.g. ``BadRequestError``).
        in_stream: send the error as an SSE event after the first chunk of a stream (HTTP 200).
    """

    status: int = 500
    message: str = "scripted upstream error"
    type: str = "InternalServerError"
    in_stream: bool = False


@dataclass
class ScriptedTurn:
    """One scripted answer.

    Attributes:
        text: the assistant text (chat) or completion text (completions).
        tool_calls: tool calls after the text (chat only).
        token_ids: ids of the text (default :func:`fake_token_ids`); any split is allowed.
        pieces: the text of each id, for streaming (default: ``text`` cut evenly over ``token_ids``).
        logprobs: one per completion id, text then tool calls (default ``-0.01 * (i + 1)``).
        prompt_token_ids: override the fake prompt ids.
        prompt_logprobs: for a ``/v1/completions`` request that asks for ``prompt_logprobs`` (vLLM's option;
            the gateway's recomputation of a guided call's logprobs sends one): the log-probabilities of the
            prompt's last ``len(prompt_logprobs)`` tokens; earlier tokens get -1.0, the first ``None`` as in vLLM.
        finish_reason: default ``"tool_calls"`` with tool calls, else ``"stop"``.
        usage: override the usage (default: counts of the prompt and of all completion ids).
        omit_token_ids: never return token ids, like a hosted API.
        swallow_tool_call_ids: in streams, the first chunk of each tool call carries no ids/logprobs
            (vLLM's tool parser swallowing tokens); usage still counts them.
        error: answer with this error instead.
        delay_s: seconds to wait before answering.
        chunk_delay_s: seconds to wait before each streamed chunk after the first.
    """

    text: str = ""
    tool_calls: list[ScriptedToolCall] = field(default_factory=list)
    token_ids: list[int] | None = None
    pieces: list[str] | None = None
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[float] | None = None
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    omit_token_ids: bool = False
    swallow_tool_call_ids: bool = False
    error: ScriptedError | None = None
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0

    def text_ids(self) -> list[int]:
        """Ids of the text part."""
        return list(self.token_ids) if self.token_ids is not None else fake_token_ids(self.text)

    def completion_ids(self) -> list[int]:
        """All completion ids: text, then each tool call's."""
        return self.text_ids() + [i for call in self.tool_calls for i in call.ids()]

    def all_logprobs(self) -> list[float]:
        """One logprob per completion id."""
        n = len(self.completion_ids())
        return (
            list(self.logprobs)
            if self.logprobs is not None
            else [round(-0.01 * (i + 1), 6) for i in range(n)]
        )

    def text_pieces(self) -> list[str]:
        """The streamed text of each text id."""
        return list(self.pieces) if self.pieces is not None else split_text(self.text, len(self.text_ids()))


@dataclass
class ScriptedRequest:
    """A request the fake received: path, JSON body and headers (lower-case names)."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
