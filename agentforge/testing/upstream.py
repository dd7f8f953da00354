"""The fake OpenAI-compatible engine: a FastAPI app answering chat and text completions from a script."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.testing.answer import Answer
from agentforge.testing.script import ScriptedRequest, ScriptedTurn, fake_token_ids

if TYPE_CHECKING:
    from agentforge.gateway.server import AppServer

__all__ = ["ScriptedUpstream"]

_ROLE_IDS = {"system": 1, "user": 2, "assistant": 3, "tool": 4}
_END_OF_TURN = 6  # what the fake template of ``/tokenize`` puts after each message


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

    Routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, the LoRA admin routes and
    ``/tokenize`` (a fake chat template: each message is its role id, its text's fake ids and an end of turn).

    Attributes:
        requests: every chat/completions request received, in order (empty with ``cycle``).
        aborted: the answers its client abandoned, as vLLM aborts a request whose client left: ``(answer
            number, streamed chunks sent before it)``, the number 1-based as :attr:`served` counts them; a
            delayed answer (``ScriptedTurn.delay_s``) is abandoned while it waits, with 0 chunks sent.
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
        self.aborted: list[tuple[int, int]] = []
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
        app.add_api_route("/tokenize", self._tokenize, methods=["POST"])
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

    async def _tokenize(self, request: Request) -> dict[str, Any]:
        """vLLM's ``/tokenize`` over a fake chat template: each message renders as its role id, its text's fake
        ids and an end-of-turn id, then the assistant role id with ``add_generation_prompt`` — enough for the
        gateway's token-in continuation (``Upstream.token_in``) to build a follow-up call's ids."""
        body = json.loads(await request.body())
        if "messages" in body:
            tokens = self._prompt_ids(body, "chat", (_END_OF_TURN,))
            if body.get("add_generation_prompt", True):
                tokens.append(_ROLE_IDS["assistant"])
        else:
            tokens = self._prompt_ids(body, "completions")
        return {"count": len(tokens), "max_model_len": self.max_model_len or 2048, "tokens": tokens}

    async def _chat(self, request: Request) -> Response:
        return await self._answer(request, "chat")

    async def _completions(self, request: Request) -> Response:
        return await self._answer(request, "completions")

    @staticmethod
    def _error(status: int, message: str, type_: str, param: str | None = None) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": message, "type": type_, "param": param, "code": status}}, status
        )

    def _prompt_ids(
        self, body: dict[str, Any], endpoint: str, end_of_turn: tuple[int, ...] = ()
    ) -> list[int]:
        """The fake ids of a request's prompt: a completions prompt's (token ids echoed), or each chat message's
        role id and text ids, followed by ``end_of_turn`` (``/tokenize``'s template closes every turn)."""
        if endpoint == "completions":
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
                return list(prompt)  # a token-id prompt: vLLM echoes its ids
            return fake_token_ids(prompt if isinstance(prompt, str) else json.dumps(prompt))
        ids: list[int] = []
        for message in body.get("messages") or []:
            ids.append(_ROLE_IDS.get(message.get("role"), 5))
            ids.extend(fake_token_ids(_content_text(message)))
            ids.extend(end_of_turn)
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
        number = self._served
        if turn.delay_s and await self._abandoned_while_waiting(request, turn.delay_s):
            self.aborted.append((number, 0))
            return Response(status_code=499)  # nobody is listening: vLLM aborts the request
        prompt_ids = (
            turn.prompt_token_ids if turn.prompt_token_ids is not None else self._prompt_ids(body, endpoint)
        )
        if self.max_model_len is not None and len(prompt_ids) > self.max_model_len:
            msg = f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt contains at least {len(prompt_ids)} input tokens."
            return self._error(400, msg, "BadRequestError", "input_tokens")
        if turn.error is not None and not (turn.error.in_stream and body.get("stream")):
            return self._error(turn.error.status, turn.error.message, turn.error.type)
        answer = Answer(
            turn,
            body,
            endpoint,
            prompt_ids,
            f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-scripted-{self._served}",
        )
        if body.get("stream"):
            return StreamingResponse(self._recorded(answer.sse(), number), media_type="text/event-stream")
        return JSONResponse(answer.full())

    @staticmethod
    async def _abandoned_while_waiting(request: Request, delay_s: float) -> bool:
        """Wait ``delay_s`` seconds; ``True`` as soon as the client has gone (checked every 20 ms)."""
        deadline = asyncio.get_running_loop().time() + delay_s
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            if await request.is_disconnected():
                return True
            await asyncio.sleep(min(0.02, left))
        return False

    async def _recorded(self, chunks: AsyncIterator[bytes], number: int) -> AsyncIterator[bytes]:
        """``chunks``, recording in :attr:`aborted` a stream its client closed before the end."""
        sent, done = 0, False
        try:
            async for chunk in chunks:
                yield chunk
                sent += 1
            done = True
        finally:
            if not done:
                self.aborted.append((number, sent))
