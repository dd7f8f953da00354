"""How a scripted turn is rendered for one request, field for field as vLLM answers: the JSON body, or the
SSE chunks of a stream (each carrying its ``token_ids``) with an optional usage chunk."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from agentforge.testing.script import ScriptedTurn, split_text

__all__ = ["Answer"]


class Answer:
    """Renders one turn as vLLM would for one request.

    Args:
        turn: the scripted answer.
        body: the request's JSON body (``return_token_ids``, ``logprobs``, ``stream_options`` and ``model``
            decide what the answer carries).
        endpoint: ``"chat"`` (``/v1/chat/completions``) or ``"completions"`` (``/v1/completions``).
        prompt_ids: the prompt's token ids to report.
        rid: the answer's id (``chatcmpl-…`` / ``cmpl-…``).
    """

    def __init__(
        self, turn: ScriptedTurn, body: dict[str, Any], endpoint: str, prompt_ids: list[int], rid: str
    ) -> None:
        self.turn, self.endpoint, self.prompt_ids, self.rid = turn, endpoint, prompt_ids, rid
        self.ids_on = bool(body.get("return_token_ids")) and not turn.omit_token_ids
        self.lp_on = bool(body.get("logprobs")) if endpoint == "chat" else body.get("logprobs") is not None
        self.prompt_lp_on = endpoint == "completions" and body.get("prompt_logprobs") is not None
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

    def _prompt_logprobs(self) -> list[dict[str, Any] | None]:
        """vLLM's ``prompt_logprobs``: ``None``, then ``{str(id): {"logprob", "rank", "decoded_token"}}`` per
        later prompt token (the turn's values for the last ones, -1.0 before them)."""
        ids = self.prompt_ids[1:]
        given = (self.turn.prompt_logprobs or [])[-len(ids) :] if ids else []
        values = [-1.0] * (len(ids) - len(given)) + list(given)
        return [None] + [
            {str(t): {"logprob": v, "rank": None, "decoded_token": ""}}
            for t, v in zip(ids, values, strict=True)
        ]

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
            if self.prompt_lp_on:
                choice["prompt_logprobs"] = self._prompt_logprobs()
        if self.ids_on:
            choice["token_ids"] = ids
        out: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion" if self.endpoint == "chat" else "text_completion",
            "created": 0,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage,
        }
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
            for n, (arg, tid) in enumerate(
                zip(split_text(call.arguments, len(call_ids)), call_ids, strict=True)
            ):
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

    async def sse(self) -> AsyncIterator[bytes]:
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
