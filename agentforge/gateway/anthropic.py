"""The Anthropic Messages API at the gateway (``POST /v1/messages``, also under ``/rollouts/{id}``).

An agent written against the ``anthropic`` SDK (or ``langchain-anthropic``) points its ``base_url`` at the
gateway and runs unchanged. The gateway translates each request into the chat route's request and serves it
through the very same path as a chat call (:meth:`agentforge.gateway.app._Gateway.handle`): routing, tenants,
privacy, probation, the token-in continuation and the span, which records the engine's prompt ids, sampled ids
and logprobs exactly as for a chat call (the stored request is the chat request the engine rendered; the span's
``attributes["dialect"]`` is ``"anthropic"``). The answer is translated back into the Messages shape:

* request: ``system`` (a string or text blocks) → a system message; ``messages`` with ``text``, ``tool_use``
  and ``tool_result`` blocks → chat messages, tool calls and ``tool`` messages; ``tools`` (``input_schema``) →
  function tools; ``tool_choice`` ``auto`` / ``any`` / ``tool`` / ``none`` → ``auto`` / ``required`` / a named
  function / ``none`` (``disable_parallel_tool_use`` → ``parallel_tool_calls: false``); ``max_tokens``,
  ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``, ``metadata.user_id`` → their chat names;
* answer: ``content`` blocks (``text``, then one ``tool_use`` per tool call with its parsed ``input``),
  ``stop_reason`` (``end_turn``, ``max_tokens``, ``stop_sequence``, ``tool_use``), ``usage``;
* streams: Anthropic's events (``message_start``, ``content_block_start`` / ``_delta`` / ``_stop`` with
  ``text_delta`` and ``input_json_delta``, ``message_delta`` with the stop reason and usage, ``message_stop``);
* errors: ``{"type": "error", "error": {"type", "message"}}`` with Anthropic's error types, which the SDK turns
  into its own typed exceptions. What the gateway cannot serve (images, documents, extended thinking, hosted
  server tools, citations) is a 400 naming the feature, never a silent drop.

Format: Anthropic's Messages API reference (docs.anthropic.com/en/api/messages, .../messages-streaming).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import AsyncContentStream, JSONResponse, Response, StreamingResponse

from agentforge.gateway.dialect_io import chat_call, error_message, translate_response, translate_stream
from agentforge.gateway.wire import Endpoint, decode_json, encode_json

__all__ = [
    "MessagesError",
    "chat_request",
    "messages_response",
    "messages_error",
    "MessagesStream",
    "messages_route",
]

#: HTTP status → Anthropic's error type (what the SDK maps to ``BadRequestError``, ``NotFoundError``, ...).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
}
#: Request fields passed on under the chat route's name.
_SAMPLING = {
    "max_tokens": "max_tokens",
    "stop_sequences": "stop",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
}
#: Request fields the gateway does not serve, with what to say.
_UNSUPPORTED = {
    "thinking": "extended thinking",
    "mcp_servers": "MCP servers",
    "container": "code-execution containers",
    "context_management": "context management",
}
#: Fields that steer Anthropic's platform, not what the model writes: taken and left aside (prompt caching, for
#: one, is automatic in vLLM's prefix cache).
_PLATFORM = frozenset(
    {
        "cache_control",
        "service_tier",
        "speed",
        "inference_geo",
        "diagnostics",
        "user_profile_id",
        "workspace_id",
    }
)
_KNOWN = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "metadata",
        "stream",
        "output_config",
        *_SAMPLING,
        *_UNSUPPORTED,
        *_PLATFORM,
    }
)


class MessagesError(ValueError):
    """A request the gateway cannot translate: ``status`` and Anthropic's ``type`` go to the client."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def messages_error(status: int, message: str) -> JSONResponse:
    """An error in the Messages API's shape (``{"type": "error", "error": {"type", "message"}}``)."""
    kind = _ERROR_TYPES.get(status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


def _text_of(blocks: Any, where: str) -> str:
    """The text of a string or of a list of ``text`` blocks."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise MessagesError(f"{where}: expected a string or a list of content blocks")
    parts = []
    for i, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            raise MessagesError(
                f"{where}[{i}]: content blocks of type {kind!r} are not supported here (text only)"
            )
        if not isinstance(block.get("text"), str):
            raise MessagesError(f"{where}[{i}].text: expected a string")
        parts.append(block["text"])
    return "".join(parts)


def _unsupported_block(kind: Any, where: str) -> MessagesError:
    name = {
        "image": "images",
        "document": "documents",
        "thinking": "extended thinking",
        "redacted_thinking": "extended thinking",
        "search_result": "search results",
        "server_tool_use": "hosted server tools",
        "web_search_tool_result": "hosted server tools",
    }.get(kind)
    what = name or f"content blocks of type {kind!r}"
    return MessagesError(f"{where}: {what} are not supported by this gateway")


def _message(role: str, content: Any, where: str) -> list[dict[str, Any]]:
    """One Anthropic message → chat messages (a user turn with tool results becomes ``tool`` messages first)."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise MessagesError(f"{where}.content: expected a string or a list of content blocks")
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        at = f"{where}.content[{i}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise MessagesError(f"{at}: a tool_use block needs a string id and name")
            arguments = encode_json(block.get("input", {})).decode()
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": block["name"], "arguments": arguments},
                }
            )
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise MessagesError(f"{at}: a tool_result block needs a string tool_use_id")
            result = _text_of(block.get("content", ""), f"{at}.content")
            if block.get("is_error"):
                result = f"Error: {result}"
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
        elif kind in ("tool_use", "tool_result"):
            raise MessagesError(
                f"{at}: a {kind} block belongs in an {'assistant' if kind == 'tool_use' else 'user'} message"
            )
        elif kind == "text":
            raise MessagesError(f"{at}.text: expected a string")
        else:
            raise _unsupported_block(kind, at)
    out: list[dict[str, Any]] = list(results)
    if role == "assistant":
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(text) if text or not calls else None,
        }
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    elif text or not results:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _tool(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise MessagesError(f"tools[{i}]: expected an object")
    if tool.get("type") not in (None, "custom"):
        raise MessagesError(
            f"tools[{i}]: hosted server tools ({tool.get('type')!r}) are not supported by this gateway"
        )
    if not isinstance(tool.get("name"), str) or not isinstance(tool.get("input_schema"), dict):
        raise MessagesError(f"tools[{i}]: a tool needs a string name and an input_schema object")
    function = {"name": tool["name"], "parameters": tool["input_schema"]}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise MessagesError("tool_choice: expected {'type': 'auto' | 'any' | 'tool' | 'none'}")
    kind = choice["type"]
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise MessagesError("tool_choice: type 'tool' needs the tool's name")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def chat_request(body: Any) -> dict[str, Any]:
    """A Messages API request body → the chat route's request body.

    Args:
        body: the decoded JSON body the client sent.

    Returns:
        The chat request (a stream asks for the final usage chunk: Anthropic's ``message_delta`` carries it).

    Raises:
        MessagesError: the body is not a Messages request this gateway serves (the message names the field).
    """
    if not isinstance(body, dict):
        raise MessagesError("request body must be a JSON object")
    unknown = sorted(k for k in body if k not in _KNOWN)
    if unknown:
        raise MessagesError(
            f"{unknown[0]}: unknown field (this gateway serves the Messages API's fields only)"
        )
    for field, what in _UNSUPPORTED.items():
        if body.get(field) not in (None, {}, []) and not (field == "thinking" and _thinking_off(body[field])):
            raise MessagesError(f"{field}: {what} is not supported by this gateway")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise MessagesError("model: required (a string)")
    if (
        not isinstance(body.get("max_tokens"), int)
        or isinstance(body.get("max_tokens"), bool)
        or body["max_tokens"] < 1
    ):
        raise MessagesError("max_tokens: required (a positive integer)")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MessagesError("messages: required (a non-empty list)")
    chat_messages: list[dict[str, Any]] = []
    if body.get("system") not in (None, "", []):
        chat_messages.append({"role": "system", "content": _text_of(body["system"], "system")})
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise MessagesError(f"messages[{i}].role: expected 'user' or 'assistant'")
        chat_messages.extend(_message(message["role"], message.get("content"), f"messages[{i}]"))
    chat: dict[str, Any] = {"model": body["model"], "messages": chat_messages}
    for field, name in _SAMPLING.items():
        if body.get(field) is not None:
            chat[name] = body[field]
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise MessagesError("tools: expected a list")
        chat["tools"] = [_tool(t, i) for i, t in enumerate(tools)]
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], chat)
    if body.get("output_config") is not None:
        _output_config(body["output_config"], chat)
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _output_config(config: Any, chat: dict[str, Any]) -> None:
    """``output_config.format`` (a JSON schema the answer must follow) → the chat route's ``response_format``
    (vLLM's guided decoding); other output settings (``effort``) are not served."""
    if not isinstance(config, dict):
        raise MessagesError("output_config: expected an object")
    other = sorted(k for k in config if k != "format")
    if other:
        raise MessagesError(f"output_config.{other[0]}: not supported by this gateway")
    fmt = config.get("format")
    if fmt is None:
        return
    if (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), dict)
    ):
        raise MessagesError("output_config.format: expected {'type': 'json_schema', 'schema': {...}}")
    chat["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": fmt["schema"]},
    }


def _thinking_off(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "disabled"


def _message_id(chat_id: Any) -> str:
    tail = (
        chat_id.removeprefix("chatcmpl-") if isinstance(chat_id, str) and chat_id else secrets.token_hex(12)
    )
    return f"msg_{tail}"


def _input_of(arguments: Any) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = decode_json(arguments or "{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _stop(finish_reason: Any, matched: Any, stops: list[str]) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) of a chat choice's finish reason and vLLM's ``stop_reason``."""
    if finish_reason == "stop" and isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    if finish_reason is None:
        return None, None
    return _STOP_REASONS.get(finish_reason, "end_turn"), None


def messages_response(data: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A chat completion (as the gateway answers it) → the Messages API's answer.

    Args:
        data: the chat answer's JSON (one choice).
        request: the client's Messages request (for ``stop_sequences``).

    Returns:
        ``{"id", "type": "message", "role": "assistant", "model", "content", "stop_reason", "stop_sequence",
        "usage"}``; ``model`` is the version that served the call (``policy@v3``), as on the chat route.
    """
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{secrets.token_hex(12)}",
                "name": function.get("name", ""),
                "input": _input_of(function.get("arguments")),
            }
        )
    reason, sequence = _stop(
        choice.get("finish_reason"), choice.get("stop_reason"), request.get("stop_sequences") or []
    )
    usage = data.get("usage") or {}
    return {
        "id": _message_id(data.get("id")),
        "type": "message",
        "role": "assistant",
        "model": data.get("model"),
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
        },
    }


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + encode_json(data) + b"\n\n"


class MessagesStream:
    """The chat route's stream (OpenAI chunks as SSE bytes) → Anthropic's stream events.

    Text deltas become one ``text`` block; each tool call (by its chunk ``index``) one ``tool_use`` block whose
    arguments arrive as ``input_json_delta``; a block is stopped when the next one starts. The final usage chunk
    gives ``message_delta``'s ``output_tokens`` (and ``message_start``'s ``input_tokens`` come from the first
    chunk that carries usage, else 0: vLLM reports usage once, at the end). An error event of the chat stream
    becomes Anthropic's ``error`` event.
    """

    def __init__(self, request: dict[str, Any]) -> None:
        self._stops = request.get("stop_sequences") or []
        self._model = request.get("model")
        self._started = False
        self._block: tuple[str, int] | None = None  # ("text", 0) or ("tool", chat tool index)
        self._index = -1
        self._finish: tuple[str | None, str | None] = (None, None)
        self._usage: dict[str, Any] = {}

    def events(self, chunks: AsyncContentStream) -> AsyncGenerator[bytes, None]:
        """Translate the chat SSE byte stream ``chunks`` (closed when done or closed early)."""
        return translate_stream(chunks, self.on_chunk)

    def on_chunk(self, chunk: dict[str, Any] | None) -> bytes:
        """The Messages events for one chat event (``None``: the chat stream's ``[DONE]``)."""
        if chunk is None:  # [DONE]
            return self._finish_message()
        if "error" in chunk:
            return _event(
                "error",
                {"type": "error", "error": {"type": "api_error", "message": error_message(chunk)}},
            )
        out = [] if self._started else [self._start(chunk)]
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out.append(self._open(("text", 0), {"type": "text", "text": ""}))
                out.append(
                    _event(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": self._index,
                            "delta": {"type": "text_delta", "text": delta["content"]},
                        },
                    )
                )
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                key = ("tool", int(call.get("index", 0)))
                if self._block != key:
                    block = {
                        "type": "tool_use",
                        "id": call.get("id") or f"toolu_{secrets.token_hex(12)}",
                        "name": function.get("name", ""),
                        "input": {},
                    }
                    out.append(self._open(key, block))
                if function.get("arguments"):
                    out.append(
                        _event(
                            "content_block_delta",
                            {
                                "type": "content_block_delta",
                                "index": self._index,
                                "delta": {"type": "input_json_delta", "partial_json": function["arguments"]},
                            },
                        )
                    )
            if choice.get("finish_reason") is not None:
                self._finish = _stop(choice["finish_reason"], choice.get("stop_reason"), self._stops)
        return b"".join(out)

    def _start(self, chunk: dict[str, Any]) -> bytes:
        self._started = True
        usage = chunk.get("usage") or {}
        message = {
            "id": _message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": chunk.get("model", self._model),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": 0},
        }
        return _event("message_start", {"type": "message_start", "message": message})

    def _open(self, key: tuple[str, int], block: dict[str, Any]) -> bytes:
        if self._block == key:
            return b""
        out = self._close()
        self._block, self._index = key, self._index + 1
        return out + _event(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        self._block = None
        return _event("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _finish_message(self) -> bytes:
        out = b"" if self._started else self._start({})
        reason, sequence = self._finish
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason or "end_turn", "stop_sequence": sequence},
            "usage": {"output_tokens": self._usage.get("completion_tokens", 0)},
        }
        return (
            out
            + self._close()
            + _event("message_delta", delta)
            + _event("message_stop", {"type": "message_stop"})
        )


def messages_route(
    handle: Callable[[Request, Endpoint], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """The ``POST /v1/messages`` route over the gateway's chat handler ``handle(request, "chat")``.

    The chat handler gets a request whose body is :func:`chat_request`'s translation (same scope: path
    parameters, headers, the client); its answer is translated back (:func:`messages_response`,
    :class:`MessagesStream`, :func:`messages_error`). The chat handler records the span; this route marks it
    with the dialect through the scope (``scope["agentforge.dialect"]``).
    """

    async def route(request: Request) -> Response:
        raw = await request.body()
        try:
            body = decode_json(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return messages_error(400, f"request body is not valid JSON: {exc}")
        try:
            chat = chat_request(body)
        except MessagesError as exc:
            return messages_error(exc.status, str(exc))
        answer = await handle(chat_call(request, encode_json(chat), "anthropic"), "chat")
        if answer.status_code >= 400:
            return messages_error(answer.status_code, _error_message(answer))
        if isinstance(answer, StreamingResponse):  # the relay's events, translated on the way
            translate_response(answer, MessagesStream(body).on_chunk)
            return answer
        data = decode_json(bytes(answer.body))
        return JSONResponse(messages_response(data, body))

    return route


def _error_message(answer: Response) -> str:
    try:
        data = decode_json(bytes(answer.body))
        return str(data["error"]["message"])
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return f"HTTP {answer.status_code}"
