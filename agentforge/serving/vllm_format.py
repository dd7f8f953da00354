"""Shape generated tokens into vLLM's OpenAI-compatible responses (for the embedded backend).

vLLM 0.32's shapes, as the gateway reads them (``return_token_ids: true``, ``logprobs``):

* chat: ``choices[0].token_ids``, top-level ``prompt_token_ids``, ``choices[0].logprobs.content[i] =
  {"token", "logprob", "bytes", "top_logprobs"}``; streamed chunks carry their own ``token_ids``, the first
  chunk (role only) carries ``prompt_token_ids``;
* completions: ``choices[0].text``, ``choices[0].token_ids`` and ``choices[0].prompt_token_ids``,
  ``logprobs = {"text_offset", "token_logprobs", "tokens", "top_logprobs"}``;
* tool calls (Hermes format, as vLLM's ``hermes`` parser): ``<tool_call>{"name", "arguments"}</tool_call>``
  in the text becomes ``message.tool_calls`` with JSON-string arguments and ``finish_reason="tool_calls"``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from agentforge.toolcalls import parse_tool_calls

__all__ = [
    "Step",
    "parse_tool_calls",
    "prompt_logprob_entries",
    "ResponseShaper",
]  # parse_tool_calls: from agentforge.toolcalls

#: One generated token: ``(token_id, logprob, [(top_id, top_logprob), ...])``; logprobs are natural logs.
Step = tuple[int, float, list[tuple[int, float]]]


def prompt_logprob_entries(
    tokenizer: Any, ids: list[int], values: list[float]
) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs`` list: ``None`` for the first token, then ``{str(id): {"logprob", "rank",
    "decoded_token"}}`` per prompt token (``values[i]`` is the log-probability of ``ids[i + 1]``)."""
    return [None] + [
        {str(t): {"logprob": v, "rank": None, "decoded_token": tokenizer.decode([t])}}
        for t, v in zip(ids[1:], values, strict=True)
    ]


class ResponseShaper:
    """Builds one response (whole or streamed) for one request.

    Args:
        tokenizer: a transformers tokenizer (``decode``).
        body: the request body.
        chat: chat completions (else text completions).
        prompt_ids: the prompt's token ids.
        stop_ids: token ids that end generation with ``finish_reason="stop"``.
        limit: the completion length limit (tokens); reaching it gives ``finish_reason="length"``.
    """

    def __init__(
        self,
        tokenizer: Any,
        body: dict[str, Any],
        *,
        chat: bool,
        prompt_ids: list[int],
        stop_ids: set[int],
        limit: int,
    ) -> None:
        self.tok, self.body, self.chat, self.prompt_ids = tokenizer, body, chat, prompt_ids
        self.stop_ids, self.limit = stop_ids, limit
        self.want_ids = bool(body.get("return_token_ids"))
        logprobs = body.get("logprobs")  # completions: an int, and 0 asks for the sampled token's (as vLLM)
        self.want_lp = bool(logprobs) if chat else logprobs is not None and logprobs is not False
        self.tools = bool(body.get("tools")) and body.get("tool_choice") != "none"
        kind = "chatcmpl" if chat else "cmpl"
        self.meta = {
            "id": f"{kind}-{uuid.uuid4().hex[:16]}",
            "created": int(time.time()),
            "model": body.get("model"),
        }

    def _piece(self, token: int) -> str:
        return self.tok.decode([token], skip_special_tokens=False)

    def _text(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def _finish(self, ids: list[int]) -> str:
        return "stop" if ids and ids[-1] in self.stop_ids else "length"

    def _chat_lp(self, step: Step) -> dict[str, Any]:
        def entry(token: int, logprob: float) -> dict[str, Any]:
            piece = self._piece(token)
            return {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}

        return entry(step[0], step[1]) | {"top_logprobs": [entry(i, lp) for i, lp in step[2]]}

    def _completion_lp(self, steps: list[Step], offset: int) -> dict[str, Any]:
        tokens = [self._piece(s[0]) for s in steps]
        offsets = [offset + sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        tops = [
            {t: s[1]} | {self._piece(i): lp for i, lp in s[2]} for t, s in zip(tokens, steps, strict=True)
        ]
        return {
            "text_offset": offsets,
            "token_logprobs": [s[1] for s in steps],
            "tokens": tokens,
            "top_logprobs": tops,
        }

    def _usage(self, n: int) -> dict[str, int]:
        return {
            "prompt_tokens": len(self.prompt_ids),
            "total_tokens": len(self.prompt_ids) + n,
            "completion_tokens": n,
        }

    def full(self, steps: list[Step]) -> dict[str, Any]:
        """The non-streamed response body."""
        ids = [s[0] for s in steps]
        text, finish = self._text(ids), self._finish(ids)
        if self.chat:
            content, calls = parse_tool_calls(text) if self.tools else (text, [])
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"], finish = calls, "tool_calls"
            choice: dict[str, Any] = {"index": 0, "message": message}
            choice["logprobs"] = {"content": [self._chat_lp(s) for s in steps]} if self.want_lp else None
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": self._completion_lp(steps, 0) if self.want_lp else None,
            }
        choice |= {"finish_reason": finish, "stop_reason": None, "token_ids": ids if self.want_ids else None}
        out = {
            **self.meta,
            "object": "chat.completion" if self.chat else "text_completion",
            "choices": [choice],
        }
        out["usage"] = self._usage(len(ids))
        if self.want_ids:
            (out if self.chat else choice)["prompt_token_ids"] = self.prompt_ids
        return out

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return f"data: {json.dumps({**self.meta, 'object': obj, 'choices': choices, **extra})}\n\n"

    def stream(self, steps: Iterable[Step]) -> Iterator[str]:
        """Server-sent events, one chunk per token (tool calls: parsed into the last chunk), then ``[DONE]``."""
        ids: list[int] = []
        sent = ""
        if self.chat:
            first = {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            yield self._event([first], **({"prompt_token_ids": self.prompt_ids} if self.want_ids else {}))
        for step in steps:
            ids.append(step[0])
            text, finish = self._text(ids), self._finish(ids)
            last = finish == "stop" or len(ids) >= self.limit
            delta, sent = ("", sent) if self.tools else (text[len(sent) :], text)
            if self.chat:
                choice: dict[str, Any] = {"index": 0, "delta": {"content": delta} if delta else {}}
                choice["logprobs"] = {"content": [self._chat_lp(step)]} if self.want_lp else None
                if last and self.tools:
                    content, calls = parse_tool_calls(text)
                    choice["delta"] = {"content": content} | (
                        {"tool_calls": [c | {"index": i} for i, c in enumerate(calls)]} if calls else {}
                    )
                    finish = "tool_calls" if calls else finish
            else:
                offset = len(sent) - len(delta)
                choice = {
                    "index": 0,
                    "text": delta,
                    "logprobs": self._completion_lp([step], offset) if self.want_lp else None,
                }
                if self.want_ids and len(ids) == 1:
                    choice["prompt_token_ids"] = self.prompt_ids
            choice["finish_reason"] = finish if last else None
            if last:
                choice["stop_reason"] = None
            if self.want_ids:
                choice["token_ids"] = [step[0]]
            yield self._event([choice])
        if (self.body.get("stream_options") or {}).get("include_usage"):
            yield self._event([], usage=self._usage(len(ids)))
        yield "data: [DONE]\n\n"
