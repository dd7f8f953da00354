"""The wire of a token-in continuation (:mod:`agentforge.gateway.prefix`): the engine's ``/v1/completions``
answer to a token-id prompt turned into the chat answer the client asked for, whole or as a short stream.

The chat answer has vLLM's shape with ``return_token_ids`` (``prompt_token_ids`` at top level,
``choices[0].token_ids``, ``choices[0].logprobs.content``), so the gateway records and shapes it as any
other chat answer. Tool calls are parsed from Hermes ``<tool_call>`` tags as vLLM's ``hermes`` parser and the
embedded backend do (:func:`agentforge.toolcalls.parse_tool_calls`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from agentforge.gateway.upstream import UpstreamTimeout, UpstreamUnreachable
from agentforge.gateway.wire import ClientAsk, decode_json, encode_json, shape_chunk
from agentforge.toolcalls import parse_tool_calls

if TYPE_CHECKING:
    from agentforge.gateway.router import Upstream
    from agentforge.gateway.upstream import UpstreamClient

__all__ = ["UpstreamTokens", "chat_answer", "chat_events", "engine_headers"]

logger = logging.getLogger("agentforge.gateway")


def engine_headers(upstream: Upstream) -> dict[str, str]:
    """The headers of a request to ``upstream`` (JSON, and its key when it has one)."""
    headers = {"content-type": "application/json"}
    if upstream.api_key:
        headers["authorization"] = f"Bearer {upstream.api_key}"
    return headers


class UpstreamTokens:
    """An engine's tokenizer routes (vLLM's ``/detokenize`` and ``/tokenize``, served by the embedded backend too):
    the :class:`~agentforge.privacy.answer.EngineTokens` the privacy policy re-tokenises a masked answer with.

    Args:
        client: the gateway's pooled upstream client.
        upstream: the engine that served the call.
    """

    def __init__(self, client: UpstreamClient, upstream: Upstream) -> None:
        self.client, self.upstream = client, upstream

    async def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any] | None:
        url = self.upstream.base_url.rstrip("/").removesuffix("/v1") + route
        try:
            response = await self.client.post(url, encode_json(body), engine_headers(self.upstream), False)
        except (UpstreamTimeout, UpstreamUnreachable) as exc:
            logger.warning("the engine's %s failed: %s", route, exc)
            return None
        data = decode_json(response.content or b"") if response.status_code < 400 else None
        if not isinstance(data, dict):
            logger.warning("the engine's %s answered HTTP %d", route, response.status_code)
            return None
        return data

    async def detokenize(self, ids: list[int]) -> str | None:
        """The text of ``ids`` as the engine decodes them, or ``None``."""
        data = await self._post("/detokenize", {"model": self.upstream.model, "tokens": ids})
        text = data.get("prompt") if data else None
        return text if isinstance(text, str) else None

    async def tokenize(self, text: str) -> list[int] | None:
        """The ids of ``text`` (no special tokens added), or ``None``."""
        body = {"model": self.upstream.model, "prompt": text, "add_special_tokens": False}
        data = await self._post("/tokenize", body)
        ids = data.get("tokens") if data else None
        return ids if isinstance(ids, list) and all(type(t) is int for t in ids) else None


def _chat_logprobs(logprobs: Any) -> dict[str, Any] | None:
    """Completions logprobs (``tokens``, ``token_logprobs``, ``top_logprobs``) in the chat shape."""
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("token_logprobs"), list):
        return None
    tokens = logprobs.get("tokens") or [""] * len(logprobs["token_logprobs"])
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)

    def entry(token: str, value: Any) -> dict[str, Any]:
        return {"token": token, "logprob": value, "bytes": list(token.encode("utf-8", "replace"))}

    return {
        "content": [
            entry(t, v) | {"top_logprobs": [entry(k, x) for k, x in (top or {}).items()]}
            for t, v, top in zip(tokens, logprobs["token_logprobs"], tops, strict=False)
        ]
    }


def chat_answer(data: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The engine's ``/v1/completions`` answer to a token-id prompt as the chat answer vLLM would give.

    Args:
        data: the completions answer (``choices[0].text``, ``token_ids``, ``prompt_token_ids``, ``logprobs``).
        body: the client's chat request (``tools``, ``tool_choice``, ``parallel_tool_calls``).

    Returns:
        A chat completion in vLLM's shape with ``return_token_ids``: ``prompt_token_ids`` at top level,
        ``choices[0].token_ids``, ``choices[0].logprobs.content``; tool calls parsed from Hermes
        ``<tool_call>`` tags when the request has tools and ``tool_choice`` is not ``"none"``
        (``finish_reason`` then ``"tool_calls"`` when generation stopped on its own).

    Raises:
        KeyError, TypeError, IndexError: ``data`` is not a completions answer.
    """
    choice = data["choices"][0]
    text = choice.get("text") or ""
    tools = bool(body.get("tools")) and body.get("tool_choice") != "none"
    content, calls = parse_tool_calls(text) if tools else (text, [])
    if body.get("parallel_tool_calls") is False:
        calls = calls[:1]
    finish = choice.get("finish_reason")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
        finish = "tool_calls" if finish == "stop" else finish
    out_choice = {
        "index": 0,
        "message": message,
        "logprobs": _chat_logprobs(choice.get("logprobs")),
        "finish_reason": finish,
        "stop_reason": choice.get("stop_reason"),
        "token_ids": choice.get("token_ids"),
    }
    answer_id = str(data.get("id") or "").removeprefix("cmpl-")
    return {
        "id": f"chatcmpl-{answer_id}",
        "object": "chat.completion",
        "created": data.get("created"),
        "model": data.get("model"),
        "choices": [out_choice],
        "usage": data.get("usage"),
        "prompt_token_ids": choice.get("prompt_token_ids"),
    }


async def chat_events(answer: dict[str, Any], ask: ClientAsk, version: str) -> AsyncIterator[bytes]:
    """A whole chat answer as a short SSE stream: role, content + tool calls (+ ids, logprobs), finish, usage.

    Args:
        answer: a chat answer (:func:`chat_answer`).
        ask: what the client asked to receive (each chunk goes through :func:`~agentforge.gateway.wire.shape_chunk`).
        version: the version that served it (the chunks' ``model``).

    Yields:
        ``data: {...}\\n\\n`` events, then ``data: [DONE]\\n\\n``.
    """
    head = {k: answer.get(k) for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    choice = answer["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"content": message.get("content") or ""}
    if message.get("tool_calls"):
        delta["tool_calls"] = [c | {"index": i} for i, c in enumerate(message["tool_calls"])]
    chunks = [
        head
        | {
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
            "prompt_token_ids": answer.get("prompt_token_ids"),
        },
        head
        | {
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": choice.get("logprobs"),
                    "finish_reason": None,
                    "token_ids": choice.get("token_ids"),
                }
            ]
        },
        head
        | {
            "choices": [
                {
                    "index": 0,
                    "delta": {},
                    "logprobs": None,
                    "finish_reason": choice["finish_reason"],
                    "stop_reason": choice.get("stop_reason"),
                }
            ]
        },
        head | {"choices": [], "usage": answer.get("usage")},
    ]
    for chunk in chunks:
        shaped = shape_chunk(chunk, ask, version)
        if shaped is not None:
            yield b"data: " + encode_json(shaped) + b"\n\n"
    yield b"data: [DONE]\n\n"
