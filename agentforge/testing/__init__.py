"""Fakes for testing agents and graphs without a real LLM: a scripted OpenAI-compatible engine and an
in-memory trace store.

:class:`ScriptedUpstream` answers ``/v1/chat/completions`` and ``/v1/completions`` from a script of
:class:`ScriptedTurn` s, in order, the way vLLM does: with ``return_token_ids: true`` it returns
``prompt_token_ids`` and per-choice ``token_ids``; with ``logprobs`` it returns one logprob per token;
``stream: true`` produces vLLM-shaped chunks (each carrying its ``token_ids``) and, with
``stream_options.include_usage``, a final usage chunk. A turn can also omit token ids (a hosted API),
swallow ids in tool-call chunks (what a tool-call parser does in vLLM), fail with an error, or be slow.
Run it in-process through :meth:`ScriptedUpstream.transport` or on a port with
:meth:`ScriptedUpstream.serve`::

    upstream = ScriptedUpstream([ScriptedTurn("Hello!"), ScriptedTurn(tool_calls=[ScriptedToolCall("now")])])
    store = memory_store()
    app = create_gateway(store, upstream.router(), transport=upstream.transport())

Fake token ids: unless a turn gives its own, text is "tokenised" by :func:`fake_token_ids` (one id per
4-character piece, deterministic). A chat prompt is one role marker id per message followed by the fake
ids of its content (and of its tool calls), so prompts of later turns start with those of earlier ones.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentforge.gateway.router import ModelRouter, Upstream

if TYPE_CHECKING:
    from agentforge.gateway.server import AppServer
    from agentforge.ports import TraceStore

__all__ = [
    "fake_token_ids",
    "ScriptedToolCall",
    "ScriptedError",
    "ScriptedTurn",
    "ScriptedRequest",
    "ScriptedUpstream",
    "memory_store",
]

_ROLE_IDS = {"system": 1, "user": 2, "assistant": 3, "tool": 4}


def fake_token_ids(text: str) -> list[int]:
    """Deterministic fake ids: one per 4-character piece of ``text``, in ``[1000, 49000)``."""
    return [
        1000 + zlib.crc32(text[i : i + 4].encode("utf-8", "surrogatepass")) % 48000
        for i in range(0, len(text), 4)
    ]


def _split(text: str, n: int) -> list[str]:
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
        return list(self.pieces) if self.pieces is not None else _split(self.text, len(self.text_ids()))


@dataclass
class ScriptedRequest:
    """A request the fake received: path, JSON body and headers (lower-case names)."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]


def _content_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content) if content is not None else ""
    return text + (json.dumps(message["tool_calls"]) if message.get("tool_calls") else "")


class ScriptedUpstream:
    """An OpenAI-compatible fake engine answering from a script (see the module docstring).

    Args:
        turns: the answers, in order; a ``str`` is ``ScriptedTurn(text=...)``.
        model: the model name it serves (others get vLLM's 404).
        max_model_len: when set, a prompt with more fake ids than this gets vLLM's 400 context error.
        cycle: repeat the script forever (for load tests and benchmarks); requests are then counted in
            :attr:`served` but not kept in :attr:`requests`.

    Attributes:
        requests: every chat/completions request received, in order (empty with ``cycle``).
        served: answers given so far.
        base_url: ``http://scripted-upstream/v1`` (for :meth:`transport`); :meth:`serve` gives a real one.
    """

    base_url = "http://scripted-upstream/v1"

    def __init__(
        self,
        turns: Iterable[ScriptedTurn | str] = (),
        model: str = "base",
        max_model_len: int | None = None,
        cycle: bool = False,
    ) -> None:
        self.model, self.max_model_len, self.cycle = model, max_model_len, cycle
        self._turns = [ScriptedTurn(t) if isinstance(t, str) else t for t in turns]
        self._served = 0
        self.requests: list[ScriptedRequest] = []
        self.admin_requests: list[ScriptedRequest] = []
        self.app = self._build_app()

    def add(self, *turns: ScriptedTurn | str) -> None:
        """Append turns to the script."""
        self._turns.extend(ScriptedTurn(t) if isinstance(t, str) else t for t in turns)

    @property
    def remaining(self) -> int:
        """Turns not yet served."""
        return len(self._turns) - self._served

    @property
    def served(self) -> int:
        """Answers given so far."""
        return self._served

    def transport(self) -> httpx.AsyncBaseTransport:
        """An httpx transport that calls the fake in-process (pass to ``create_gateway(transport=...)``)."""
        return httpx.ASGITransport(app=self.app)

    def upstream(self, base_url: str | None = None) -> Upstream:
        """An :class:`~agentforge.gateway.router.Upstream` for this fake (``base_url`` defaults to :attr:`base_url`)."""
        return Upstream(base_url=base_url or self.base_url, model=self.model)

    def router(
        self, alias: str = "policy", version: str = "policy@v1", base_url: str | None = None
    ) -> ModelRouter:
        """A router with ``version`` served by this fake and ``alias`` pointing at it."""
        router = ModelRouter()
        router.register(version, self.upstream(base_url))
        router.set_alias(alias, version)
        return router

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> AppServer:
        """Serve the fake on a real port (background thread); use ``f"{server.url}/v1"`` as base URL."""
        from agentforge.gateway.server import AppServer

        return AppServer(self.app, host, port).start()

    # --- the fake engine --------------------------------------------------------------------------
    def _build_app(self) -> FastAPI:
        app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
        app.add_api_route("/v1/chat/completions", self._chat, methods=["POST"])
        app.add_api_route("/v1/completions", self._completions, methods=["POST"])
        app.add_api_route("/v1/models", self._models, methods=["GET"])
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            app.add_api_route(path, self._admin, methods=["POST"])
        return app

    async def _models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "scripted"}]}

    async def _admin(self, request: Request) -> dict[str, str]:
        self.admin_requests.append(
            ScriptedRequest(request.url.path, await request.json(), dict(request.headers))
        )
        return {"status": "ok"}

    async def _chat(self, request: Request) -> Response:
        return await self._answer(request, "chat")

    async def _completions(self, request: Request) -> Response:
        return await self._answer(request, "completions")

    @staticmethod
    def _error(status: int, message: str, type_: str, param: str | None = None) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": message, "type": type_, "param": param, "code": status}}, status
        )

    def _prompt_ids(self, body: dict[str, Any], endpoint: str) -> list[int]:
        if endpoint == "completions":
            prompt = body.get("prompt")
            return fake_token_ids(prompt if isinstance(prompt, str) else json.dumps(prompt))
        ids: list[int] = []
        for message in body.get("messages") or []:
            ids.append(_ROLE_IDS.get(message.get("role"), 5))
            ids.extend(fake_token_ids(_content_text(message)))
        return ids

    async def _answer(self, request: Request, endpoint: str) -> Response:
        body = json.loads(await request.body())
        if not self.cycle:
            self.requests.append(ScriptedRequest(request.url.path, body, dict(request.headers)))
        if body.get("model") != self.model:
            return self._error(
                404, f"The model `{body.get('model')}` does not exist.", "NotFoundError", "model"
            )
        if self._served >= len(self._turns) and not (self.cycle and self._turns):
            return self._error(
                500, f"ScriptedUpstream: script exhausted after {self._served} turns", "InternalServerError"
            )
        turn = self._turns[self._served % len(self._turns)]
        self._served += 1
        if turn.delay_s:
            await asyncio.sleep(turn.delay_s)
        prompt_ids = (
            turn.prompt_token_ids if turn.prompt_token_ids is not None else self._prompt_ids(body, endpoint)
        )
        if self.max_model_len is not None and len(prompt_ids) > self.max_model_len:
            msg = f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt contains at least {len(prompt_ids)} input tokens."
            return self._error(400, msg, "BadRequestError", "input_tokens")
        if turn.error is not None and not (turn.error.in_stream and body.get("stream")):
            return self._error(turn.error.status, turn.error.message, turn.error.type)
        answer = _Answer(
            turn,
            body,
            endpoint,
            prompt_ids,
            f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-scripted-{self._served}",
        )
        if body.get("stream"):
            return StreamingResponse(answer.sse(), media_type="text/event-stream")
        return JSONResponse(answer.full())


class _Answer:
    """Renders one turn as vLLM would for one request."""

    def __init__(
        self, turn: ScriptedTurn, body: dict[str, Any], endpoint: str, prompt_ids: list[int], rid: str
    ) -> None:
        self.turn, self.endpoint, self.prompt_ids, self.rid = turn, endpoint, prompt_ids, rid
        self.ids_on = bool(body.get("return_token_ids")) and not turn.omit_token_ids
        self.lp_on = bool(body.get("logprobs")) if endpoint == "chat" else body.get("logprobs") is not None
        options = body.get("stream_options") or {}
        self.usage_on = bool(options.get("include_usage"))
        self.model = body.get("model")
        self.calls = turn.tool_calls if endpoint == "chat" else []
        self.finish = turn.finish_reason or ("tool_calls" if self.calls else "stop")
        n = len(turn.text_ids()) + sum(len(c.ids()) for c in self.calls)
        self.usage = turn.usage or {
            "prompt_tokens": len(prompt_ids),
            "total_tokens": len(prompt_ids) + n,
            "completion_tokens": n,
        }

    def _calls_json(self) -> list[dict[str, Any]]:
        return [
            {
                "id": c.id or f"call_{self.rid}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(self.calls)
        ]

    def _lp(self, lps: list[float], pieces: list[str]) -> dict[str, Any] | None:
        if not self.lp_on:
            return None
        if self.endpoint == "chat":
            return {
                "content": [
                    {"token": p, "logprob": v, "bytes": list(p.encode()), "top_logprobs": []}
                    for p, v in zip(pieces, lps, strict=False)
                ]
            }
        return {"tokens": pieces, "token_logprobs": lps, "text_offset": [0] * len(lps), "top_logprobs": None}

    def full(self) -> dict[str, Any]:
        """The non-streamed answer."""
        ids, lps = self.turn.text_ids() + [i for c in self.calls for i in c.ids()], self.turn.all_logprobs()
        pieces = self.turn.text_pieces() + [""] * (len(ids) - len(self.turn.text_pieces()))
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": self._lp(lps, pieces),
            "finish_reason": self.finish,
            "stop_reason": None,
        }
        if self.endpoint == "chat":
            message: dict[str, Any] = {
                "role": "assistant",
                "content": self.turn.text or (None if self.calls else ""),
            }
            if self.calls:
                message["tool_calls"] = self._calls_json()
            choice["message"] = message
        else:
            choice["text"] = self.turn.text
            if self.ids_on:
                choice["prompt_token_ids"] = self.prompt_ids
        if self.ids_on:
            choice["token_ids"] = ids
        out: dict[str, Any] = {"id": self.rid, "object": "chat.completion" if self.endpoint == "chat" else "text_completion",
                               "created": 0, "model": self.model, "choices": [choice], "usage": self.usage}  # fmt: skip
        if self.endpoint == "chat" and self.ids_on:
            out["prompt_token_ids"] = self.prompt_ids
        return out

    def _chunk(self, choice: dict[str, Any], **top: Any) -> bytes:
        obj = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        data = {"id": self.rid, "object": obj, "created": 0, "model": self.model, "choices": [choice], **top}
        return f"data: {json.dumps(data)}\n\n".encode()

    def _pieces(self) -> Iterator[tuple[dict[str, Any], list[int], list[float], str]]:
        """(delta, ids, logprobs, token text) for each streamed token."""
        ids, lps, k = self.turn.text_ids(), self.turn.all_logprobs(), 0
        for piece, tid in zip(self.turn.text_pieces(), ids, strict=False):
            yield {"content": piece}, [tid], lps[k : k + 1], piece
            k += 1
        for j, (call, js) in enumerate(zip(self.calls, self._calls_json(), strict=True)):
            call_ids = call.ids()
            for n, (arg, tid) in enumerate(zip(_split(call.arguments, len(call_ids)), call_ids, strict=True)):
                entry: dict[str, Any] = {"index": j, "function": {"arguments": arg}}
                if n == 0:
                    entry.update(id=js["id"], type="function", function={"name": call.name, "arguments": arg})
                swallowed = n == 0 and self.turn.swallow_tool_call_ids
                yield (
                    {"tool_calls": [entry]},
                    [] if swallowed else [tid],
                    [] if swallowed else lps[k : k + 1],
                    "",
                )
                k += 1

    async def sse(self) -> Any:
        """The streamed answer (vLLM's chunk layout)."""
        top = {"prompt_token_ids": self.prompt_ids} if self.ids_on and self.endpoint == "chat" else {}
        if self.endpoint == "chat":
            yield self._chunk(
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                },
                **top,
            )
        error = self.turn.error
        if error is not None:
            yield f"data: {json.dumps({'error': {'message': error.message, 'type': error.type, 'param': None, 'code': error.status}})}\n\n".encode()
            yield b"data: [DONE]\n\n"
            return
        pieces = list(self._pieces()) or [({}, [], [], "")]
        for n, (delta, ids, lps, text) in enumerate(pieces):
            if self.turn.chunk_delay_s:
                await asyncio.sleep(self.turn.chunk_delay_s)
            last = n == len(pieces) - 1
            choice: dict[str, Any] = {
                "index": 0,
                "logprobs": self._lp(lps, [text] * len(lps)),
                "finish_reason": self.finish if last else None,
            }
            if self.endpoint == "chat":
                choice["delta"] = delta
            else:
                choice["text"] = delta.get("content", "")
                if self.ids_on:
                    choice["prompt_token_ids"] = self.prompt_ids if n == 0 else None
            if self.ids_on:
                choice["token_ids"] = ids
            yield self._chunk(choice)
        if self.usage_on:
            obj = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
            yield f"data: {json.dumps({'id': self.rid, 'object': obj, 'created': 0, 'model': self.model, 'choices': [], 'usage': self.usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"


def memory_store() -> TraceStore:
    """A fresh in-memory trace store: ``open_store("sqlite://")`` (a ``SQLStore``)."""
    from agentforge.open import open_store

    return open_store("sqlite://")
