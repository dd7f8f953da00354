"""What the gateway asks the engine for, and what it hands back to the client.

The gateway always asks the engine for token ids and logprobs (vLLM's ``return_token_ids: true`` and
``logprobs``) and, for streams, for the final usage chunk; the client receives only what it asked for:

* ``logprobs`` not requested → every ``choices[i].logprobs`` is ``null`` (OpenAI's own shape).
* ``return_token_ids`` not requested → ``prompt_token_ids`` (top level for chat, per choice for
  completions) and ``choices[i].token_ids`` are removed.
* ``stream_options.include_usage`` not requested → the final usage-only chunk is not forwarded.
* ``model`` in the answer is the resolved version (``policy@v3``), so the client can see what served it.
* A tool call whose arguments are empty (a tool without parameters) reaches the client as ``"{}"``;
  the span keeps the engine's ``""`` verbatim (see :mod:`agentforge.toolcalls`).

Hosted upstreams (``Upstream.token_ids=False``) get the request unchanged apart from ``model``.
Every error the gateway returns has OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic_core import PydanticSerializationError, from_json, to_json

from agentforge.gateway.router import Upstream

try:
    from orjson import dumps as _orjson_dumps
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - orjson is a dependency; pydantic-core works alone without it
    _orjson_loads = _orjson_dumps = None
#: orjson's decoder (``None`` without orjson), for a caller on the hot path that already knows what
#: :func:`decode_json_finite` checks first (:func:`short_numbers`); it raises ``ValueError`` for what only the
#: exact decoder reads (``NaN``, lone surrogate escapes), which :func:`decode_json_finite` then takes.
ORJSON_LOADS = _orjson_loads
_DIGITS = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_NUMBER = b"0" * 19  # a digit run this long may be an integer past 64 bits

__all__ = [
    "Endpoint",
    "ClientAsk",
    "client_ask",
    "upstream_body",
    "shape_response",
    "shape_chunk",
    "shape_token_chunk",
    "normalise_empty_arguments",
    "error_body",
    "upstream_error_body",
    "encode_json",
    "decode_json",
    "decode_json_finite",
    "json_depth",
    "MAX_JSON_DEPTH",
    "short_numbers",
    "ORJSON_LOADS",
]

Endpoint = Literal["chat", "completions"]


@dataclass(frozen=True)
class ClientAsk:
    """What the client asked to receive beyond the plain answer.

    Attributes:
        logprobs: the client requested logprobs.
        token_ids: the client requested ``return_token_ids``.
        usage_chunk: the client requested the final usage chunk of a stream.
        stream: the client requested a stream.
    """

    logprobs: bool
    token_ids: bool
    usage_chunk: bool
    stream: bool


def client_ask(body: dict[str, Any], endpoint: Endpoint) -> ClientAsk:
    """Read what the client asked for from its request body.

    Args:
        body: the JSON body as the client sent it.
        endpoint: ``"chat"`` (``/v1/chat/completions``) or ``"completions"`` (``/v1/completions``).

    Returns:
        The :class:`ClientAsk` for shaping the answer.
    """
    logprobs = bool(body.get("logprobs")) if endpoint == "chat" else body.get("logprobs") is not None
    options = body.get("stream_options")
    usage = bool(options.get("include_usage")) if isinstance(options, dict) else False
    return ClientAsk(
        logprobs=logprobs,
        token_ids=bool(body.get("return_token_ids")),
        usage_chunk=usage,
        stream=bool(body.get("stream")),
    )


def upstream_body(
    body: dict[str, Any], endpoint: Endpoint, upstream: Upstream, cache_salt: str | None = None
) -> dict[str, Any]:
    """The body sent to the engine: the client's, with the engine's model name and capture options.

    Args:
        body: the client's JSON body (not modified).
        endpoint: which OpenAI endpoint is called.
        upstream: the engine serving the resolved version.
        cache_salt: vLLM's prefix-cache namespace for the call's tenant (``None``: the shared cache); sent to
            engines with ``token_ids=True`` only (hosted APIs do not take it).

    Returns:
        A new dict. For engines with ``token_ids=True``: ``return_token_ids: true``, ``logprobs: true``
        (chat) or at least ``0`` (completions: the sampled token's logprob only), ``cache_salt`` when given
        and, when streaming, ``stream_options.include_usage: true``.
    """
    out = dict(body)
    out["model"] = upstream.model
    if not upstream.token_ids:
        return out
    out["return_token_ids"] = True
    if cache_salt is not None:
        out["cache_salt"] = cache_salt
    if endpoint == "chat":
        out["logprobs"] = True
    elif out.get("logprobs") is None:
        out["logprobs"] = 0
    if out.get("stream"):
        options = dict(out.get("stream_options") or {})
        options["include_usage"] = True
        out["stream_options"] = options
    return out


def _shape_choices(choices: Iterable[Any], ask: ClientAsk) -> None:
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if not ask.logprobs and "logprobs" in choice:
            choice["logprobs"] = None
        if not ask.token_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)


def shape_response(data: dict[str, Any], ask: ClientAsk, version: str) -> dict[str, Any]:
    """The non-streamed answer as the client should see it (see the module docstring).

    Args:
        data: the engine's JSON answer (not modified).
        ask: what the client asked for.
        version: the resolved version, written into ``model``.

    Returns:
        A new dict.
    """
    out = dict(data)  # copy on write: only what is changed is copied, the engine's dict stays intact
    out["model"] = version
    if not ask.token_ids:
        out.pop("prompt_token_ids", None)
    choices = out.get("choices")
    if isinstance(choices, list):
        out["choices"] = choices = [dict(c) if isinstance(c, dict) else c for c in choices]
        _shape_choices(choices, ask)
        for choice in choices:
            message = choice.get("message") if isinstance(choice, dict) else None
            if not isinstance(message, dict):
                continue
            calls = message.get("tool_calls")
            if not calls or not isinstance(calls, list):
                continue
            message = choice["message"] = dict(message)
            message["tool_calls"] = [_tool_call_with_arguments(call) for call in calls]
    return out


def _tool_call_with_arguments(call: Any) -> Any:
    """A copy of ``call`` whose empty ``function.arguments`` reads ``"{}"`` (the call itself if not empty)."""
    function = call.get("function") if isinstance(call, dict) else None
    if isinstance(function, dict) and not (function.get("arguments") or "").strip():
        return {**call, "function": {**function, "arguments": "{}"}}
    return call


def shape_chunk(chunk: dict[str, Any], ask: ClientAsk, version: str) -> dict[str, Any] | None:
    """One streamed chunk as the client should see it, or ``None`` to drop it.

    Args:
        chunk: the engine's decoded chunk (modified in place and returned).
        ask: what the client asked for.
        version: the resolved version, written into ``model``.

    Returns:
        The chunk, or ``None`` for the usage-only chunk the client did not ask for.
    """
    if not chunk.get("choices") and "usage" in chunk and not ask.usage_chunk:
        return None
    if not ask.usage_chunk:
        chunk.pop("usage", None)
    if "model" in chunk:
        chunk["model"] = version
    if not ask.token_ids:
        chunk.pop("prompt_token_ids", None)
    _shape_choices(chunk.get("choices") or [], ask)
    return chunk


def shape_token_chunk(chunk: dict[str, Any], choice: dict[str, Any], ask: ClientAsk, version: str) -> None:
    """:func:`shape_chunk` for a plain token's chunk: ``choice`` is its only choice, and its ``usage`` and
    ``prompt_token_ids`` are absent or ``null`` (:meth:`~agentforge.gateway.capture.StreamCapture.feed_token`
    checked it). Modifies ``chunk`` in place, as :func:`shape_chunk` would."""
    if not ask.usage_chunk:
        chunk.pop("usage", None)
    if "model" in chunk:
        chunk["model"] = version
    if not ask.token_ids:
        chunk.pop("prompt_token_ids", None)
        choice.pop("token_ids", None)
        choice.pop("prompt_token_ids", None)
    if not ask.logprobs and "logprobs" in choice:
        choice["logprobs"] = None


def normalise_empty_arguments(chunk: dict[str, Any], indexes: list[int]) -> None:
    """Add an ``arguments: "{}"`` delta for each streamed tool call that received no arguments.

    Called on the chunk that carries choice 0's ``finish_reason``, so a client accumulating deltas
    ends with ``"{}"`` instead of ``""`` for tools without parameters.

    Args:
        chunk: the finishing chunk (modified in place).
        indexes: tool-call indexes whose accumulated arguments are empty.
    """
    if not indexes:
        return
    choice = chunk["choices"][0]
    delta = choice.setdefault("delta", {}) or {}
    choice["delta"] = delta
    calls = delta.get("tool_calls") or []
    calls.extend({"index": i, "function": {"arguments": "{}"}} for i in indexes)
    delta["tool_calls"] = calls


def error_body(message: str, type_: str, code: str | int | None, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def upstream_error_body(status: int, content: bytes) -> dict[str, Any]:
    """Normalise an engine's error answer into an OpenAI-style error body.

    Args:
        status: the engine's HTTP status.
        content: the engine's response body (JSON or anything else).

    Returns:
        The engine's ``{"error": {...}}`` when it already has that shape (vLLM does), else a body whose
        message quotes the first 500 characters of what the engine sent.
    """
    try:
        data = decode_json(content)
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict) and data["error"].get("message"):
        err = data["error"]
        return error_body(
            str(err["message"]),
            str(err.get("type") or "upstream_error"),
            err.get("code", status),
            err.get("param"),
        )
    if isinstance(data, dict) and isinstance(data.get("detail") or data.get("message"), str):
        return error_body(data.get("detail") or data["message"], "upstream_error", status)
    text = content[:500].decode("utf-8", "replace").strip() or "(empty body)"
    return error_body(f"upstream answered HTTP {status}: {text}", "upstream_error", status)


def encode_json(data: Any, *, finite: bool = False) -> bytes:
    """Compact UTF-8 JSON bytes (non-ASCII kept as is, ``NaN``/``Infinity`` as Python's ``json`` writes
    them), by pydantic-core (several times faster than ``json``); text UTF-8 cannot carry (lone
    surrogates) falls back to ``\\u`` escapes.

    Args:
        data: plain JSON data.
        finite: the caller knows ``data`` holds no ``NaN``/``Infinity`` (it came from
            :func:`decode_json_finite`), so orjson may write it (another 3-4× faster; orjson would
            write ``NaN`` as ``null``).
    """
    if finite and _orjson_dumps is not None:
        try:
            return _orjson_dumps(data)
        except (TypeError, ValueError):  # lone surrogates, integers past 64 bits: the general path
            pass
    try:
        return to_json(data, inf_nan_mode="constants")
    except (PydanticSerializationError, UnicodeError, ValueError):
        try:
            return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(data, separators=(",", ":")).encode("ascii")


def short_numbers(data: bytes) -> bool:
    """Whether ``data`` holds no run of 19 or more digits, so that orjson reads every number in it exactly
    (one check of a block of stream events stands for each event in it)."""
    return _LONG_NUMBER not in data.translate(_DIGITS)


#: The deepest JSON a request may nest: a span stores the request, and its encoders stop near 1,000 levels
#: (pydantic-core's serializer, Python's ``json``), which made bodies nested 990-1023 deep a 500 with no span.
MAX_JSON_DEPTH = 256


def json_depth(value: Any) -> int:
    """How deep lists and objects nest in ``value`` (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def decode_json_finite(data: bytes, *, short: bool = False) -> tuple[Any, bool]:
    """:func:`decode_json`, and whether orjson read it (then the value holds no ``NaN``/``Infinity`` and
    may be written back with ``encode_json(value, finite=True)``).

    Args:
        data: UTF-8 JSON.
        short: the caller already knows :func:`short_numbers` holds for ``data`` (skips the check).

    Raises:
        ValueError, UnicodeDecodeError: as :func:`decode_json`.
    """
    if _orjson_loads is not None and (short or _LONG_NUMBER not in data.translate(_DIGITS)):
        try:
            return _orjson_loads(data), True
        except ValueError:
            pass
    return _decode_exact(data), False


def decode_json(data: bytes | str) -> Any:
    """Parse JSON as Python's ``json.loads`` does (``NaN``/``Infinity``, big integers, lone surrogate
    escapes): by orjson (about 3× faster than pydantic-core on an engine's answer with logprobs), which
    refuses ``NaN`` and lone surrogates, for text without a run of 19 or more digits (orjson reads
    integers past 64 bits as floats); else by pydantic-core, then ``json``.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``).
        UnicodeDecodeError: bytes that are not UTF-8.
    """
    if isinstance(data, bytes):
        return decode_json_finite(data)[0]
    return _decode_exact(data)


def _decode_exact(data: bytes | str) -> Any:
    """pydantic-core, then Python's ``json`` for what only it reads (see :func:`decode_json`)."""
    try:
        return from_json(data, allow_inf_nan=True)
    except ValueError:
        try:
            return json.loads(data)
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None
