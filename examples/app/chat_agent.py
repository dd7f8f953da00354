"""The agent the app serves: examples/openai_sdk_agent.py's customer-service agent, one user turn at a time.

It imports nothing of agentforge: it gets an ``AsyncOpenAI`` client (the app points it at the gateway,
attributed to the conversation's rollout) and a message list it extends in place. Both ways of answering
send the model the same requests, so a streamed turn records the same spans as a plain one:

* :func:`reply` — returns the answer once it is complete;
* :func:`stream_reply` — yields the answer's text as the model produces it, plus one event per tool call.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for openai_sdk_agent

from openai_sdk_agent import FEW_SHOT, SYSTEM, TOOLS, run_tool  # noqa: E402

__all__ = ["new_conversation", "reply", "stream_reply", "as_sse"]

#: Most model calls per user turn (a model that keeps calling tools is cut off here).
MAX_CALLS = 3


def new_conversation(system: str = SYSTEM) -> list[dict[str, Any]]:
    """A fresh message list: the system prompt (default openai_sdk_agent's) and its worked examples."""
    return [{"role": "system", "content": system}, *FEW_SHOT]


def _request(model: str, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """The arguments of one model call (greedy, fixed seed: repeatable)."""
    return {
        "model": model,
        "messages": messages,
        "tools": TOOLS,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": 0,
    }


def _assistant_entry(text: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message as it goes back into the history (``content`` is ``None`` when empty)."""
    entry: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        entry["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls
        ]
    return entry


def _execute(messages: list[dict[str, Any]], calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run the tool calls with openai_sdk_agent's ``run_tool``, append their results, and report them."""
    done = []
    for c in calls:
        call = SimpleNamespace(id=c["id"], function=SimpleNamespace(name=c["name"], arguments=c["arguments"]))
        result = run_tool(call)
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
        done.append({"name": c["name"], "arguments": c["arguments"], "result": result})
    return done


async def reply(
    client: AsyncOpenAI, model: str, messages: list[dict[str, Any]], max_tokens: int = 48
) -> tuple[str, list[dict[str, Any]]]:
    """Answer the last user message, running tool calls in between (at most :data:`MAX_CALLS` model calls).

    Args:
        client: the OpenAI client (the app's points at ``{gateway}/rollouts/{rollout_id}/v1``).
        model: the model name, e.g. the gateway alias ``policy``.
        messages: the conversation so far, ending with the user's message; extended in place.
        max_tokens: completion limit per model call, tokens.

    Returns:
        ``(text, tool_calls)``: the final assistant text and ``[{"name", "arguments", "result"}]``.

    Raises:
        openai.APIError: a model call failed (``messages`` may hold part of the turn).
    """
    tools_run: list[dict[str, Any]] = []
    text = ""
    for _ in range(MAX_CALLS):
        out = await client.chat.completions.create(**_request(model, messages, max_tokens))
        msg = out.choices[0].message
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in (msg.tool_calls or [])
        ]
        text = msg.content or ""
        messages.append(_assistant_entry(text, calls))
        if not calls:
            break
        tools_run += _execute(messages, calls)
    return text, tools_run


async def stream_reply(
    client: AsyncOpenAI, model: str, messages: list[dict[str, Any]], max_tokens: int = 48
) -> AsyncIterator[dict[str, Any]]:
    """Like :func:`reply`, streamed: the same model calls with ``stream=True``.

    Yields:
        ``{"type": "delta", "text": str}`` for each piece of assistant text, ``{"type": "tool", "name",
        "arguments", "result"}`` for each tool call run, and last ``{"type": "done", "reply": str,
        "tool_calls": [...]}``.

    Raises:
        openai.APIError: a model call failed.
    """
    tools_run: list[dict[str, Any]] = []
    text = ""
    for _ in range(MAX_CALLS):
        stream = await client.chat.completions.create(**_request(model, messages, max_tokens), stream=True)
        pieces: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        async for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            if delta.content:
                pieces.append(delta.content)
                yield {"type": "delta", "text": delta.content}
            for part in delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = part.id or call["id"]
                if part.function is not None:
                    call["name"] += part.function.name or ""
                    call["arguments"] += part.function.arguments or ""
        text = "".join(pieces)
        ordered = [calls[i] for i in sorted(calls)]
        messages.append(_assistant_entry(text, ordered))
        if not ordered:
            break
        for done in _execute(messages, ordered):
            tools_run.append(done)
            yield {"type": "tool", **done}
    yield {"type": "done", "reply": text, "tool_calls": tools_run}


def as_sse(event: dict[str, Any]) -> str:
    """One server-sent event: ``event: <type>`` and the rest of ``event`` as JSON ``data``."""
    data = {k: v for k, v in event.items() if k != "type"}
    return f"event: {event['type']}\ndata: {json.dumps(data)}\n\n"
