"""One gateway call before the engine answers: its context and the checks on its body; and the gateway's
own answers that need no engine (health, unknown routes, other HTTP errors), all in OpenAI's error shape."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentforge.gateway.wire import Endpoint, error_body
from agentforge.types import now

if TYPE_CHECKING:
    from agentforge.gateway.router import ModelRouter, Upstream
    from agentforge.privacy.flight import CallPrivacy

__all__ = [
    "CallContext",
    "clean_text",
    "validate_body",
    "lone_surrogate",
    "health_response",
    "not_found",
    "http_error",
]


#: The scope key a dialect route (:mod:`agentforge.gateway.anthropic`, :mod:`agentforge.gateway.responses`) sets on
#: the chat request it hands the gateway, so that the span records which API the client spoke.
DIALECT_KEY = "agentforge.dialect"


class CallContext:
    """Everything known about one call before the engine answers (shared by the unary and stream paths).

    Attributes:
        endpoint: ``"chat"`` or ``"completions"``.
        body: the request body as the client sent it.
        rollout_id: attribution from the URL prefix or ``X-Rollout-Id`` (``None`` for an orphan).
        attempt_id: the ``X-Attempt-Id`` header, if any.
        started_at: wall-clock start, seconds since the epoch.
        t0: ``time.perf_counter()`` at the start, for ``latency_s``.
        version: the resolved version (empty until resolved).
        logprobs_mode: the resolved upstream's log-prob mode (recorded on the span; ``None``: not known).
        tenant: the tenant the call acts for (recorded on the span; ``None``: none).
        privacy: what the gateway's privacy policy did to this call (``None``: nothing; ``body`` is then
            the client's own).
        upstream: the engine serving the call (``None`` until resolved).
        dialect: the API the client spoke when not the chat route's own (``"anthropic"``: the Messages API,
            translated to this chat call by :mod:`agentforge.gateway.anthropic`); recorded on the span.
    """

    def __init__(
        self, endpoint: Endpoint, body: dict[str, Any], rollout_id: str | None, attempt_id: str | None
    ) -> None:
        self.endpoint: Endpoint = endpoint
        self.body = body
        self.rollout_id, self.attempt_id = rollout_id, attempt_id
        self.started_at, self.t0 = now(), time.perf_counter()
        self.version = ""
        self.tenant: str | None = None
        self.logprobs_mode: str | None = None
        self.privacy: CallPrivacy | None = None
        self.dialect: str | None = None
        self.upstream: Upstream | None = None

    @property
    def model(self) -> str:
        """The model name the client asked for."""
        value = self.body.get("model")
        return value if isinstance(value, str) else ""

    def latency_s(self) -> float:
        """Seconds since the request arrived."""
        return time.perf_counter() - self.t0


def clean_text(text: str) -> str:
    """Make a message storable in a SQL text column (no NUL, no lone surrogates)."""
    return text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


def validate_body(body: dict[str, Any], endpoint: Endpoint) -> tuple[str, str] | None:
    """``(param, message)`` for a body the engine cannot take, else ``None``."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model", "'model' is required and must be a non-empty string"
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "messages", "'messages' must be a non-empty list of messages"
        for message in messages:
            if not isinstance(message, dict):
                return "messages", "every item of 'messages' must be an object"
            if not isinstance(message.get("role"), str):
                return "messages", "every message needs a 'role' string (system, user, assistant, tool, ...)"
    elif "prompt" not in body:
        return "prompt", "'prompt' is required"
    if "stream" in body and body["stream"] is not None and not isinstance(body["stream"], bool):
        return "stream", "'stream' must be true or false"
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return "stream_options", "'stream_options' must be an object"
    return None


def lone_surrogate(body: dict[str, Any]) -> tuple[str, str] | None:
    """``(param, message)`` when a string of ``body`` (a key or a value, at any depth) holds a lone UTF-16
    surrogate (a ``\\ud800``–``\\udfff`` escape without its pair), else ``None``.

    Such a string is not text: UTF-8 cannot encode it and no tokenizer takes it (vLLM answers with its
    tokenizer's internals). Only JSON that orjson refused can hold one, so the gateway runs this only then.
    ``param`` is where the first one sits, e.g. ``messages[1].content`` (for a key: the object holding it).
    The walk is iterative (no recursion limit on a deeply nested body).
    """
    todo: list[tuple[str, Any]] = [("", body)]
    while todo:
        where, value = todo.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                where = where or "body"
                return where, (
                    f"'{where}' holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape): it is not "
                    "text, no tokenizer can encode it; send the character's full surrogate pair or UTF-8"
                )
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                todo.append((f"{where}.{key}" if where else key, item))
                todo.append((where, key))  # a key sits in its object: checked before its value
        elif isinstance(value, list):
            todo.extend((f"{where}[{i}]", item) for i, item in reversed(list(enumerate(value))))
    return None


def health_response(router: ModelRouter) -> JSONResponse:
    """``{"status": "ok"}``, or 503 ``{"status": "degraded", "engines_down": {version: why}}`` while serving's
    supervisor has an engine marked down (no engine address is named)."""
    down = router.engines_down()
    if not down:
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": "degraded", "engines_down": down}, status_code=503)


async def http_error(request: Request, exc: Exception) -> Response:
    """An HTTP error of the gateway's own routes (405, ...) in OpenAI's shape; the mounted store routes
    (``/api/...``) keep the store's own error format, which its client reads."""
    path, root = request.scope.get("path", ""), request.scope.get("root_path") or ""
    if path.removeprefix(root).startswith("/api/") and isinstance(exc, StarletteHTTPException):
        return await http_exception_handler(request, exc)
    status = getattr(exc, "status_code", 500)
    msg = f"{request.method} {request.url.path}: {getattr(exc, 'detail', None) or 'error'}"
    return JSONResponse(
        error_body(msg, "invalid_request_error", "method_not_allowed" if status == 405 else "http_error"),
        status_code=status,
        headers=getattr(exc, "headers", None),
    )


async def not_found(request: Request) -> JSONResponse:
    msg = f"no route {request.method} {request.url.path} on the agentforge gateway"
    return JSONResponse(error_body(msg, "invalid_request_error", "not_found"), status_code=404)
