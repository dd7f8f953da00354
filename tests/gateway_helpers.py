"""Helpers shared by the gateway tests (not fixtures)."""

from __future__ import annotations

import json
from typing import Any

CHAT = {"model": "policy", "messages": [{"role": "user", "content": "What time is it?"}]}


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Decode a complete SSE body, asserting it is well formed and ends with ``data: [DONE]``."""
    assert text.endswith("\n\n"), text[-200:]
    events = text[:-2].split("\n\n")
    assert events[-1] == "data: [DONE]", events[-1]
    out = []
    for event in events[:-1]:
        assert event.startswith("data: ") and "\n" not in event, event[:200]
        out.append(json.loads(event[len("data: ") :]))
    return out


def streamed_arguments(chunks: list[dict[str, Any]]) -> dict[int, str]:
    """Accumulate tool-call arguments the way an OpenAI client does."""
    args: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                args[call["index"]] = args.get(call["index"], "") + (call.get("function") or {}).get(
                    "arguments", ""
                )
    return args
