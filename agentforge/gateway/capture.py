"""Build the token-exact :class:`~agentforge.types.LLMCall` of one gateway call.

One path for both modes: a non-streamed answer is read directly; a stream is folded by
:class:`StreamCapture` into the same shape the engine would have answered without streaming, then read
by the same function. So a streamed call and a non-streamed one with the same tokens give the same
record (ids, logprobs, usage, finish_reason, tool calls).

Where vLLM puts things (``return_token_ids: true``, verified on vLLM 0.32):

* chat, non-streamed: ``prompt_token_ids`` at top level; ``choices[0].token_ids``;
  ``choices[0].logprobs.content[i].logprob``.
* chat, streamed: ``prompt_token_ids`` at top level of the first chunk; ``token_ids`` and
  ``logprobs.content`` in each chunk's ``choices[0]``; a final chunk with ``choices: []`` and ``usage``.
* completions: ``choices[0].prompt_token_ids``, ``choices[0].token_ids`` and
  ``choices[0].logprobs.token_logprobs`` (streamed: the same per chunk; ``prompt_token_ids`` only in
  the first).

Ids are never rebuilt from text. When they cannot be trusted the call is kept with ``trainable=False``
and a flag naming the reason (see :data:`UNTRAINABLE_FLAGS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

try:
    from orjson import OPT_PASSTHROUGH_SUBCLASS as _NO_SUBCLASSES
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - orjson is a dependency
    _orjson_dumps = None

from agentforge.gateway.wire import Endpoint
from agentforge.toolcalls import (
    MALFORMED_ARGUMENTS,
    TOOL_ARGUMENTS_INVALID,
    check_tool_schemas,
    tool_call_from_openai,
)
from agentforge.types import LLMCall

__all__ = [
    "SAMPLING_KEYS",
    "TOOL_CALL_TRUNCATED",
    "UNTRAINABLE_FLAGS",
    "sampling_params",
    "llm_call_from_response",
    "StreamCapture",
]

#: Request keys copied into ``LLMCall.sampling``.
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "top_logprobs",
    "tool_choice",
    "response_format",
)

#: Flag of a call that hit the token limit in the middle of a tool call (the client gets the partial text as
#: content and no tool call, as vLLM answers it; the sampled ids stay trainable, so raise ``max_tokens``).
TOOL_CALL_TRUNCATED = "tool_call_truncated"

#: Flags that make a call unusable for training, with their meaning.
UNTRAINABLE_FLAGS = {
    "no_token_ids": "the upstream returned no prompt or completion token ids (hosted API?)",
    "no_logprobs": "the upstream returned no logprobs",
    "logprob_count_mismatch": "the number of logprobs differs from the number of completion ids",
    "token_ids_missing": "fewer completion ids than usage.completion_tokens (a parser swallowed some)",
    "token_count_mismatch": "more completion ids than usage.completion_tokens",
    "prompt_token_count_mismatch": "prompt ids differ in number from usage.prompt_tokens",
    "stream_incomplete": "the stream ended before a finish_reason",
}


def sampling_params(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling parameters of a request (the :data:`SAMPLING_KEYS` it sets)."""
    return {k: body[k] for k in SAMPLING_KEYS if k in body}


def _int_list(value: Any) -> list[int] | None:
    """A copy of ``value`` (a list decoded from JSON) when it is a list of plain ints (no bools), else ``None``.

    Token id lists are the longest values of every call (a 2,000-token prompt is 2,000 ids), so the check
    runs at C speed: orjson writes the list, and between its brackets only digits, minus signs and commas
    may remain (a bool, float, string, ``null`` or nested list writes another byte). An int orjson refuses
    (beyond 64 bits, or of an int subclass) falls back to the type check, which takes plain ints of any
    size. 12 µs for 2,000 ids against 36 µs for the type check alone (``set(map(type, ...))``).
    """
    if not isinstance(value, list):
        return None
    if _orjson_dumps is not None and value:
        try:
            written = _orjson_dumps(value, option=_NO_SUBCLASSES)
        except TypeError:
            pass
        else:
            return list(value) if written.translate(None, _ID_BYTES) == b"[]" else None
    return list(value) if not value or set(map(type, value)) == _INT_ONLY else None


_INT_ONLY = {int}
_ID_BYTES = b"0123456789,-"


def _logprobs(choice: dict[str, Any], endpoint: Endpoint) -> list[float] | None:
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if endpoint == "chat":
        content = lp.get("content")
        if not isinstance(content, list):
            return None
        return [float(item["logprob"]) for item in content if isinstance(item, dict) and "logprob" in item]
    values = lp.get("token_logprobs")
    return [float(v) for v in values if v is not None] if isinstance(values, list) else None


def _one_logprob(lp: dict[str, Any]) -> list[float] | None:
    """:func:`_logprobs` of a chat choice whose ``logprobs`` is ``lp``, for the usual one-token case only
    (``content`` is a list of one object with a ``logprob``); ``None`` for anything else."""
    content = lp.get("content")
    if type(content) is list and len(content) == 1:
        item = content[0]
        if type(item) is dict and "logprob" in item:
            return [float(item["logprob"])]
    return None


def _cut_tool_call(request: dict[str, Any], text: Any, tool_calls: list[Any]) -> bool:
    """Whether a call that hit the token limit was writing a tool call: a Hermes ``<tool_call>`` tag (or the
    JSON list guided decoding writes for ``tool_choice="required"``) left in the text, or a call whose
    arguments do not parse."""
    if not request.get("tools") or request.get("tool_choice") == "none":
        return False
    written = text if isinstance(text, str) else ""
    if "<tool_call>" in written or written.lstrip().startswith("[{"):
        return True
    return any(MALFORMED_ARGUMENTS in c.flags for c in tool_calls)


def _consistency_flags(call: LLMCall) -> list[str]:
    flags: list[str] = []
    ids, usage = call.completion_token_ids, call.usage
    if ids is None or call.prompt_token_ids is None:
        flags.append("no_token_ids")
    if ids is not None:
        if call.logprobs is None:
            flags.append("no_logprobs")
        elif len(call.logprobs) != len(ids):
            flags.append("logprob_count_mismatch")
        expected = usage.get("completion_tokens")
        if isinstance(expected, int) and len(ids) < expected:
            flags.append("token_ids_missing")
        elif isinstance(expected, int) and len(ids) > expected:
            flags.append("token_count_mismatch")
    prompt_expected = usage.get("prompt_tokens")
    if call.prompt_token_ids is not None and isinstance(prompt_expected, int):
        if len(call.prompt_token_ids) != prompt_expected:
            flags.append("prompt_token_count_mismatch")
    return flags


def llm_call_from_response(
    data: dict[str, Any],
    *,
    endpoint: Endpoint,
    request: dict[str, Any],
    model: str,
    version: str,
    stream: bool = False,
    latency_s: float = 0.0,
    extra_flags: list[str] | None = None,
) -> LLMCall:
    """Read the engine's (non-streamed-shaped) answer into an :class:`~agentforge.types.LLMCall`.

    Only choice 0 is recorded; more choices (``n > 1``) add the flag ``extra_choices_dropped``.

    Args:
        data: the engine's JSON answer, or :meth:`StreamCapture.response` for a stream.
        endpoint: ``"chat"`` or ``"completions"``.
        request: the request body as the client sent it (stored verbatim).
        model: the model name the client asked for.
        version: the version that served the call.
        stream: whether the client streamed.
        latency_s: seconds from receiving the request to the last byte of the answer.
        extra_flags: flags found while reading the stream (e.g. ``stream_incomplete``).

    Returns:
        The record; ``trainable`` is false when any flag of :data:`UNTRAINABLE_FLAGS` is set.
    """
    choices = found if isinstance(found := data.get("choices"), list) else []
    choice: dict[str, Any] = choices[0] if choices and isinstance(choices[0], dict) else {}
    if endpoint == "chat":
        message = found if isinstance(found := choice.get("message"), dict) else {}
        text = message.get("content") or ""
        raw_calls = message.get("tool_calls") or []
        prompt_ids = _int_list(data.get("prompt_token_ids"))
    else:
        text, raw_calls = choice.get("text") or "", []
        prompt_ids = _int_list(choice.get("prompt_token_ids"))
    tool_calls = [tool_call_from_openai(c) for c in raw_calls if isinstance(c, dict)]
    usage = found if isinstance(found := data.get("usage"), dict) else {}
    flags = list(extra_flags or [])
    if len(choices) > 1:
        flags.append("extra_choices_dropped")
    if any(MALFORMED_ARGUMENTS in c.flags for c in tool_calls):
        flags.append("malformed_tool_call")
    # keys and types against each tool's parameters schema (agentforge.toolcalls: check_tool_schemas)
    if tool_calls and check_tool_schemas(tool_calls, request.get("tools")):
        flags.append(TOOL_ARGUMENTS_INVALID)
    if choice.get("finish_reason") == "length" and _cut_tool_call(request, text, tool_calls):
        flags.append(TOOL_CALL_TRUNCATED)
    call = LLMCall(
        model=model,
        version=version,
        endpoint=endpoint,
        stream=stream,
        request=request,
        sampling=sampling_params(request),
        logprobs=_logprobs(choice, endpoint),
        response_text=text if isinstance(text, str) else str(text),
        tool_calls=tool_calls,
        finish_reason=choice.get("finish_reason"),
        usage={k: v for k, v in usage.items() if v is not None},
        latency_s=latency_s,
    )
    # checked by _int_list, which is stricter than the model's lax list[int] (it takes True and 1.0 as 1):
    # assigned unvalidated (pydantic validates on construction only), the prompt's ids are not checked twice
    call.prompt_token_ids, call.completion_token_ids = prompt_ids, _int_list(choice.get("token_ids"))
    flags.extend(_consistency_flags(call))
    call.flags = list(dict.fromkeys(flags))
    call.trainable = not any(f in UNTRAINABLE_FLAGS for f in call.flags)
    return call


@dataclass
class _ToolAcc:
    id: str | None = None
    type: str = "function"
    name: str = ""
    arguments: str = ""


@dataclass
class StreamCapture:
    """Fold streamed chunks (decoded ``data:`` payloads) into one non-streamed-shaped answer.

    Only choice 0 is accumulated. Ids and logprobs are concatenated exactly as the chunks carry them.

    Attributes:
        endpoint: ``"chat"`` or ``"completions"``.
    """

    endpoint: Endpoint
    _prompt_ids: list[int] | None = None
    _ids: list[int] | None = None
    _logprobs: list[float] | None = None
    _text: list[str] = field(default_factory=list)
    _tools: dict[int, _ToolAcc] = field(default_factory=dict)
    _finish_reason: str | None = None
    _usage: dict[str, Any] | None = None
    _extra_choices: bool = False
    _last: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """Whether choice 0 has received its ``finish_reason``."""
        return self._finish_reason is not None

    def feed(self, chunk: dict[str, Any]) -> bool:
        """Add one chunk.

        Args:
            chunk: a decoded ``data:`` payload of the engine's stream.

        Returns:
            True when this chunk carried choice 0's ``finish_reason``.
        """
        if "id" in chunk and chunk.get("id") != self._last.get("id"):  # the same on every chunk of a stream
            self._last = {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        if self._prompt_ids is None:
            self._prompt_ids = _int_list(chunk.get("prompt_token_ids"))
        finished = False
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                self._extra_choices = True
                continue
            finished = self._feed_choice(choice) or finished
        return finished

    def feed_token(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """Add one chunk if it is a plain token's chunk, as nearly every chunk of a stream is: one choice
        (index 0) without ``finish_reason``, prompt ids or tool-call deltas, no ``usage`` or ``error``, the
        stream's ``id``. Adds exactly what :meth:`feed` would and skips its general checks (a chunk of one
        token, one id and one logprob, is read without building a list comprehension or a set).

        Args:
            chunk: a decoded ``data:`` payload of the engine's stream.

        Returns:
            The chunk's choice when it was added; ``None`` (nothing added) for any other chunk, which
            :meth:`feed` takes.
        """
        choices = chunk.get("choices")
        if type(choices) is not list or len(choices) != 1:
            return None
        choice = choices[0]
        if type(choice) is not dict:
            return None
        get, top = choice.get, chunk.get
        if (
            get("finish_reason") is not None
            or get("index", 0) != 0
            or get("prompt_token_ids") is not None
            or top("prompt_token_ids") is not None
            or top("usage") is not None
            or "error" in chunk
            or ("id" in chunk and chunk["id"] != self._last.get("id"))
        ):
            return None
        if self.endpoint == "chat":
            delta = get("delta")
            if type(delta) is not dict or "tool_calls" in delta:
                return None
            text = delta.get("content")
            lp = get("logprobs")
            lps = _one_logprob(lp) if type(lp) is dict else None
            if lps is None:
                lps = _logprobs(choice, "chat")
        else:
            text = get("text")
            lps = _logprobs(choice, self.endpoint)
        ids = get("token_ids")
        if type(ids) is list:
            if len(ids) == 1 and type(ids[0]) is int:
                ids = [ids[0]]
            else:
                ids = _int_list(ids)
        else:
            ids = None
        self._append_tokens(ids, lps)
        if isinstance(text, str):
            self._text.append(text)
        return choice

    def _append_tokens(self, ids: list[int] | None, lps: list[float] | None) -> None:
        """Extend the captured completion ids and logprobs by one chunk's (``None``: the chunk had none)."""
        if ids is not None:
            if self._ids is None:
                self._ids = ids
            else:
                self._ids.extend(ids)
        if lps is not None:
            if self._logprobs is None:
                self._logprobs = lps
            else:
                self._logprobs.extend(lps)

    def _feed_choice(self, choice: dict[str, Any]) -> bool:
        if self._prompt_ids is None:
            self._prompt_ids = _int_list(choice.get("prompt_token_ids"))
        self._append_tokens(_int_list(choice.get("token_ids")), _logprobs(choice, self.endpoint))
        if self.endpoint == "chat":
            delta = found if isinstance(found := choice.get("delta"), dict) else {}
            if isinstance(delta.get("content"), str):
                self._text.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                self._feed_tool(call)
        elif isinstance(choice.get("text"), str):
            self._text.append(choice["text"])
        if choice.get("finish_reason") is not None:
            self._finish_reason = choice["finish_reason"]
            return True
        return False

    def _feed_tool(self, call: dict[str, Any]) -> None:
        acc = self._tools.setdefault(int(call.get("index", 0)), _ToolAcc())
        acc.id = call.get("id") or acc.id
        acc.type = call.get("type") or acc.type
        function = call.get("function") or {}
        acc.name += function.get("name") or ""
        acc.arguments += function.get("arguments") or ""

    def empty_argument_indexes(self) -> list[int]:
        """Indexes of accumulated tool calls whose arguments are still empty."""
        return [i for i, acc in sorted(self._tools.items()) if not acc.arguments.strip()]

    def response(self) -> dict[str, Any]:
        """The accumulated answer in the engine's non-streamed shape (for :func:`llm_call_from_response`)."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": self._finish_reason, "token_ids": self._ids}
        text = "".join(self._text)
        if self.endpoint == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if self._tools:
                message["tool_calls"] = [
                    {"id": t.id, "type": t.type, "function": {"name": t.name, "arguments": t.arguments}}
                    for _, t in sorted(self._tools.items())
                ]
            choice["message"] = message
            choice["logprobs"] = (
                None if self._logprobs is None else {"content": [{"logprob": v} for v in self._logprobs]}
            )
        else:
            choice["text"] = text
            choice["prompt_token_ids"] = self._prompt_ids
            choice["logprobs"] = None if self._logprobs is None else {"token_logprobs": self._logprobs}
        out: dict[str, Any] = dict(self._last, choices=[choice] + ([{}] if self._extra_choices else []))
        if self.endpoint == "chat":
            out["prompt_token_ids"] = self._prompt_ids
        if self._usage is not None:
            out["usage"] = self._usage
        return out
