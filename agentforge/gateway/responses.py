"""The OpenAI Responses API at the gateway (``POST /v1/responses``, also under ``/rollouts/{id}``).

Agents written against the Responses API (the OpenAI Agents SDK calls it by default) point their ``base_url`` at
the gateway and run unchanged. As for the Anthropic dialect (:mod:`agentforge.gateway.anthropic`), each request
is translated into the chat route's request and served by the same handler as a chat call, so routing, tenants,
privacy, probation, the token-in continuation and the token-exact span are the chat call's
(``attributes["dialect"] = "responses"``); the answer is translated back:

* request: ``instructions`` → a system message; ``input`` (a string, or items: messages with ``input_text`` /
  ``output_text`` parts, ``function_call`` and ``function_call_output``) → chat messages (an assistant message
  and the function calls after it are one chat message, as the model wrote them); function ``tools`` →
  chat tools; ``tool_choice``, ``parallel_tool_calls``, ``max_output_tokens``, ``temperature``, ``top_p``,
  ``user``, ``text.format`` (``json_schema`` → ``response_format``);
* ``previous_response_id``: the gateway remembers, per stored response (``store`` not false), the conversation
  it ended (the chat messages without the instructions, and the answer) and prepends it, as the Responses API
  does (instructions and tools are not carried over). The memory is this process's (an LRU of
  :data:`MAX_RESPONSES`); an unknown id is a 404;
* answer: a ``response`` object whose ``output`` holds a ``message`` item (one ``output_text`` part) and one
  ``function_call`` item per tool call; ``status`` ``completed`` or ``incomplete`` (``max_output_tokens``);
* streams: the Responses events (``response.created``, ``response.in_progress``, ``response.output_item.added``,
  ``response.content_part.added``, ``response.output_text.delta`` / ``.done``, ``response.content_part.done``,
  ``response.function_call_arguments.delta`` / ``.done``, ``response.output_item.done``, ``response.completed``
  or ``response.incomplete``), numbered by ``sequence_number``;
* errors keep OpenAI's shape (the SDK raises its typed errors); hosted tools (web search, file search, computer
  use, code interpreter, image generation, MCP), images, files, reasoning items and background mode are a 400
  naming the feature.

Format: OpenAI's Responses API reference (platform.openai.com/docs/api-reference/responses and
.../responses-streaming), as the ``openai`` SDK's types and stream accumulator read it.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import AsyncContentStream, JSONResponse, Response, StreamingResponse

from agentforge.gateway.dialect_io import chat_call, error_message, translate_response, translate_stream
from agentforge.gateway.wire import Endpoint, decode_json, encode_json, error_body

__all__ = [
    "ResponsesError",
    "ResponseMemory",
    "chat_request",
    "response_object",
    "ResponsesStream",
    "responses_route",
]

#: Stored conversations this process keeps for ``previous_response_id`` (least recently used go first).
MAX_RESPONSES = 4096
_HOSTED = {
    "web_search",
    "web_search_preview",
    "file_search",
    "computer_use_preview",
    "computer_use",
    "code_interpreter",
    "image_generation",
    "mcp",
    "local_shell",
    "shell",
    "apply_patch",
    "custom",
}
_KNOWN = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "user",
        "text",
        "stream",
        "previous_response_id",
        "store",
        "metadata",
        "truncation",
        "include",
        "reasoning",
        "background",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "stream_options",
        "top_logprobs",
        "max_tool_calls",
        "conversation",
        "prompt",
        "prompt_cache_retention",
        "prompt_cache_options",
        "context_management",
    }
)


class ResponsesError(ValueError):
    """A request the gateway cannot translate (``param`` names the field)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


def _error(exc: ResponsesError) -> JSONResponse:
    code = "not_found" if exc.status == 404 else "invalid_value"
    kind = "invalid_request_error"
    return JSONResponse(error_body(str(exc), kind, code, exc.param), status_code=exc.status)


class ResponseMemory:
    """The conversations of stored responses, for ``previous_response_id`` (an LRU of ``size``).

    Each entry is the chat messages of the call without its system message, plus the assistant message the
    gateway answered: what a follow-up continues. Safe from one event loop (no locks: no awaits inside).
    """

    def __init__(self, size: int = MAX_RESPONSES) -> None:
        self._size = size
        self._items: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def remember(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        """Keep ``messages`` (the conversation ``response_id`` ended) under its id."""
        self._items[response_id] = messages
        self._items.move_to_end(response_id)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def recall(self, response_id: str) -> list[dict[str, Any]]:
        """The conversation ``response_id`` ended. Raises: ``ResponsesError`` (404) when it is not kept."""
        messages = self._items.get(response_id)
        if messages is None:
            raise ResponsesError(
                f"previous response {response_id!r} not found (it was not stored, or this gateway "
                "has restarted or forgotten it)",
                "previous_response_id",
                404,
            )
        self._items.move_to_end(response_id)
        return [dict(m) for m in messages]


def _parts_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ResponsesError("expected a string or a list of content parts", where)
    out = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append(part["refusal"])
        elif kind in ("input_image", "input_file", "input_audio"):
            what = {"input_image": "images", "input_file": "files", "input_audio": "audio"}[kind]
            raise ResponsesError(f"{what} are not supported by this gateway", f"{where}[{i}]")
        else:
            raise ResponsesError(f"content parts of type {kind!r} are not supported here", f"{where}[{i}]")
    return "".join(out)


def _items(items: Any, messages: list[dict[str, Any]]) -> None:
    """Append the chat form of Responses input ``items`` to ``messages``."""
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return
    if not isinstance(items, list):
        raise ResponsesError("expected a string or a list of input items", "input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ResponsesError("expected an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ResponsesError("role must be user, system, developer or assistant", f"{where}.role")
            text = _parts_text(item.get("content"), f"{where}.content")
            messages.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name")):
                raise ResponsesError("a function_call item needs string call_id and name", where)
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments") or ""},
            }
            last = messages[-1] if messages else None
            if (
                last is not None and last["role"] == "assistant"
            ):  # the text and calls the model wrote together
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise ResponsesError("a function_call_output item needs a string call_id", where)
            output = _parts_text(item.get("output", ""), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "reasoning":
            raise ResponsesError("reasoning items are not supported by this gateway", where)
        else:
            raise ResponsesError(f"input items of type {kind!r} are not supported by this gateway", where)


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise ResponsesError("expected a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            hosted = kind in _HOSTED or (
                isinstance(kind, str) and kind.startswith(("web_search", "computer"))
            )
            what = f"hosted tools ({kind!r})" if hosted else f"tools of type {kind!r}"
            raise ResponsesError(
                f"{what} are not supported by this gateway; declare function tools", f"tools[{i}]"
            )
        if not isinstance(tool.get("name"), str):
            raise ResponsesError("a function tool needs a string name", f"tools[{i}].name")
        function: dict[str, Any] = {
            "name": tool["name"],
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
        }
        for key in ("description", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ResponsesError(
        "expected 'auto', 'none', 'required' or {'type': 'function', 'name': ...}", "tool_choice"
    )


def chat_request(
    body: Any, memory: ResponseMemory | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A Responses API request body → (the chat route's request body, its messages without the system one).

    Raises:
        ResponsesError: a field this gateway cannot serve (``param`` names it; 404 for an unknown
            ``previous_response_id``).
    """
    if not isinstance(body, dict):
        raise ResponsesError("request body must be a JSON object")
    unknown = sorted(k for k in body if k not in _KNOWN)
    if unknown:
        raise ResponsesError("unknown field", unknown[0])
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise ResponsesError("required (a string)", "model")
    if body.get("background"):
        raise ResponsesError("background mode is not supported by this gateway", "background")
    for field in ("conversation", "prompt", "context_management"):
        if body.get(field) is not None:
            what = "context management" if field == "context_management" else f"stored {field}s"
            raise ResponsesError(f"{what} is not supported by this gateway", field)
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and any(v is not None for v in reasoning.values()):
        raise ResponsesError("reasoning settings are not supported by this gateway", "reasoning")
    history: list[dict[str, Any]] = []
    if body.get("previous_response_id") is not None:
        if memory is None or not isinstance(body["previous_response_id"], str):
            raise ResponsesError("not found", "previous_response_id", 404)
        history = memory.recall(body["previous_response_id"])
    if body.get("input") is None:
        raise ResponsesError("required", "input")
    _items(body["input"], history)
    messages = list(history)
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    for field, name in (
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("user", "user"),
    ):
        if body.get(field) is not None:
            chat[name] = body[field]
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {"name": fmt.get("name") or "output", "schema": fmt.get("schema") or {}}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        raise ResponsesError(f"text format {fmt.get('type')!r} is not supported", "text.format")
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat, history


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def _envelope(body: dict[str, Any], response_id: str, created: int, model: Any) -> dict[str, Any]:
    """The request-echo fields every ``response`` object carries."""
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "model": model or body.get("model"),
        "output": [],
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "text": {"format": fmt or {"type": "text"}},
        "truncation": "disabled",
        "store": body.get("store", True),
        "user": body.get("user"),
        "usage": None,
    }


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    i, o = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {
        "input_tokens": i,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": o,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": i + o,
    }


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _finish(response: dict[str, Any], finish_reason: Any) -> None:
    if finish_reason == "length":
        response["status"], response["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
    else:
        response["status"] = "completed"


def response_object(
    data: dict[str, Any], body: dict[str, Any], response_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A chat completion (as the gateway answers it) → (the ``response`` object, the assistant chat message).

    Args:
        data: the chat answer's JSON (one choice).
        body: the client's Responses request.
        response_id: this response's id.
    """
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    response = _envelope(body, response_id, int(data.get("created") or time.time()), data.get("model"))
    if message.get("content"):
        response["output"].append(_message_item(_new_id("msg"), message["content"]))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        response["output"].append(
            _call_item(
                _new_id("fc"),
                call.get("id") or _new_id("call"),
                function.get("name", ""),
                function.get("arguments") or "{}",
            )
        )
    _finish(response, choice.get("finish_reason"))
    response["usage"] = _usage(data.get("usage") or {})
    assistant = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        assistant["tool_calls"] = message["tool_calls"]
    return response, assistant


class ResponsesStream:
    """The chat route's stream (OpenAI chunks as SSE bytes) → the Responses API's stream events.

    Text deltas are one ``message`` output item with one ``output_text`` part; each tool call (by its chunk
    ``index``) one ``function_call`` item; an item is done when the next one starts or the stream ends. The
    finished ``response`` (``response.completed``, or ``response.incomplete`` when cut by ``max_output_tokens``)
    carries every item and the usage; :attr:`assistant` is then the answer as a chat message (for
    :class:`ResponseMemory`). An error event of the chat stream becomes ``response.failed``.
    """

    def __init__(self, body: dict[str, Any], response_id: str) -> None:
        self._body, self.response_id = body, response_id
        self._seq = 0
        self._response: dict[str, Any] | None = None
        self._open: dict[str, Any] | None = None  # the item being written
        self._open_key: tuple[str, int] | None = None
        self._finish_reason: Any = None
        self.assistant: dict[str, Any] | None = None  #: set when the stream completed

    def events(self, chunks: AsyncContentStream) -> AsyncGenerator[bytes, None]:
        """Translate the chat SSE byte stream ``chunks`` (closed when done or closed early)."""
        return translate_stream(chunks, self.on_chunk)

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        data = {"type": kind, **data, "sequence_number": self._seq}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + encode_json(data) + b"\n\n"

    def on_chunk(self, chunk: dict[str, Any] | None) -> bytes:
        """The Responses events for one chat event (``None``: the chat stream's ``[DONE]``)."""
        if chunk is None:  # [DONE]
            return self._complete()
        out = [] if self._response is not None else [self._start(chunk)]
        assert self._response is not None
        if "error" in chunk:
            self._response["status"] = "failed"
            self._response["error"] = {"code": "server_error", "message": error_message(chunk)}
            return b"".join(out) + self._event("response.failed", {"response": self._response})
        if chunk.get("usage"):
            self._response["usage"] = _usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out.append(self._text(delta["content"]))
            for call in delta.get("tool_calls") or []:
                out.append(self._call(call))
            if choice.get("finish_reason") is not None:
                self._finish_reason = choice["finish_reason"]
        return b"".join(out)

    def _start(self, chunk: dict[str, Any]) -> bytes:
        self._response = _envelope(
            self._body, self.response_id, int(chunk.get("created") or time.time()), chunk.get("model")
        )
        return self._event("response.created", {"response": self._response}) + self._event(
            "response.in_progress", {"response": self._response}
        )

    def _index(self) -> int:
        assert self._response is not None
        return len(self._response["output"])

    def _text(self, text: str) -> bytes:
        out = b""
        if self._open_key != ("text", 0):
            out += self._close()
            item = _message_item(_new_id("msg"), "", "in_progress")
            item["content"] = []
            self._open, self._open_key = item, ("text", 0)
            out += self._event("response.output_item.added", {"output_index": self._index(), "item": item})
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self._event(
                "response.content_part.added",
                {"item_id": item["id"], "output_index": self._index(), "content_index": 0, "part": part},
            )
            item["content"].append(dict(part))
        assert self._open is not None
        self._open["content"][0]["text"] += text
        return out + self._event(
            "response.output_text.delta",
            {
                "item_id": self._open["id"],
                "output_index": self._index(),
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            },
        )

    def _call(self, call: dict[str, Any]) -> bytes:
        function = call.get("function") or {}
        key = ("tool", int(call.get("index", 0)))
        out = b""
        if self._open_key != key:
            out += self._close()
            item = _call_item(
                _new_id("fc"), call.get("id") or _new_id("call"), function.get("name", ""), "", "in_progress"
            )
            self._open, self._open_key = item, key
            out += self._event(
                "response.output_item.added", {"output_index": self._index(), "item": dict(item)}
            )
        assert self._open is not None
        if function.get("arguments"):
            self._open["arguments"] += function["arguments"]
            out += self._event(
                "response.function_call_arguments.delta",
                {"item_id": self._open["id"], "output_index": self._index(), "delta": function["arguments"]},
            )
        return out

    def _close(self) -> bytes:
        item, index = self._open, self._index()
        if item is None:
            return b""
        self._open = self._open_key = None
        out = b""
        if item["type"] == "message":
            part = item["content"][0]
            out += self._event(
                "response.output_text.done",
                {
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "text": part["text"],
                    "logprobs": [],
                },
            )
            out += self._event(
                "response.content_part.done",
                {"item_id": item["id"], "output_index": index, "content_index": 0, "part": part},
            )
        else:
            item["arguments"] = item["arguments"] or "{}"
            out += self._event(
                "response.function_call_arguments.done",
                {"item_id": item["id"], "output_index": index, "arguments": item["arguments"]},
            )
        item["status"] = "completed"
        assert self._response is not None
        self._response["output"].append(item)
        return out + self._event("response.output_item.done", {"output_index": index, "item": item})

    def _complete(self) -> bytes:
        out = b"" if self._response is not None else self._start({})
        out += self._close()
        response = self._response
        assert response is not None
        if response["status"] == "failed":
            return out
        _finish(response, self._finish_reason)
        if response["usage"] is None:
            response["usage"] = _usage({})
        text = "".join(i["content"][0]["text"] for i in response["output"] if i["type"] == "message")
        calls = [
            {
                "id": i["call_id"],
                "type": "function",
                "function": {"name": i["name"], "arguments": i["arguments"]},
            }
            for i in response["output"]
            if i["type"] == "function_call"
        ]
        self.assistant = {
            "role": "assistant",
            "content": text or None,
            **({"tool_calls": calls} if calls else {}),
        }
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, {"response": response})


def responses_route(
    handle: Callable[[Request, Endpoint], Awaitable[Response]], memory: ResponseMemory | None = None
) -> Callable[[Request], Awaitable[Response]]:
    """The ``POST /v1/responses`` route over the gateway's chat handler ``handle(request, "chat")`` (see the
    module docstring); ``memory`` keeps stored responses' conversations for ``previous_response_id``."""
    memory = memory if memory is not None else ResponseMemory()

    async def route(request: Request) -> Response:
        raw = await request.body()
        try:
            body = decode_json(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return JSONResponse(
                error_body(f"request body is not valid JSON: {exc}", "invalid_request_error", "invalid_json"),
                status_code=400,
            )
        try:
            chat, history = chat_request(body, memory)
        except ResponsesError as exc:
            return _error(exc)
        answer = await handle(chat_call(request, encode_json(chat), "responses"), "chat")
        if answer.status_code >= 400:
            return answer  # OpenAI's error shape already
        response_id = _new_id("resp")
        keep = body.get("store", True) is not False
        if isinstance(answer, StreamingResponse):  # the relay's events, translated on the way
            stream = ResponsesStream(body, response_id)

            def on_chunk(chunk: dict[str, Any] | None) -> bytes:
                out = stream.on_chunk(chunk)
                if chunk is None and keep and stream.assistant is not None:  # the stream completed
                    memory.remember(response_id, [*history, stream.assistant])
                return out

            translate_response(answer, on_chunk)
            return answer
        response, assistant = response_object(decode_json(bytes(answer.body)), body, response_id)
        if keep:
            memory.remember(response_id, [*history, assistant])
        return JSONResponse(response)

    return route
