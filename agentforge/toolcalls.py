"""Tool calls as the engine emitted them: parse the argument string, flag what is wrong, and turn a
malformed call into a tool-error message the agent can send back to the model.

A core module beside :mod:`agentforge.types`: the gateway's capture records calls with it and agents answer
malformed calls with it, so an agent needs no part of the gateway (only an OpenAI client).

The gateway never rewrites a malformed call: the raw ``arguments`` string is stored and passed to the
agent exactly as the engine produced it (the model sampled those tokens, and training must see them).
What the agent does with a call it cannot execute is the agent's business; :func:`tool_error_messages`
is the helper for it (runner and agent code call it after each assistant turn)::

    reply = client.chat.completions.create(model="policy", messages=messages, tools=tools)
    messages.append(reply.choices[0].message.model_dump(exclude_none=True))
    errors = tool_error_messages(reply.choices[0].message)
    messages.extend(errors)          # the model sees "arguments are not valid JSON ..." and may retry
    # ...execute only the calls whose id is not in {e["tool_call_id"] for e in errors}

Rules (one place, used by the gateway's capture and by the helper):

* ``""`` / whitespace / ``None`` arguments (a tool without parameters; vLLM streams no argument delta
  for it) → ``parsed = {}`` and flag ``empty_arguments_normalised``.
* A JSON object → ``parsed`` is it. A brace inside a string value (``{"code": "if (x) {"}``) is valid
  JSON and parses normally; nothing counts braces.
* Anything else (truncated JSON, a stray or missing brace outside strings, a JSON array/number) →
  ``parsed = None`` and flag ``malformed_arguments``; the raw string is kept as sent.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from agentforge.types import ToolCall

__all__ = [
    "EMPTY_ARGUMENTS",
    "MALFORMED_ARGUMENTS",
    "parse_tool_arguments",
    "parse_tool_calls",
    "tool_call_from_openai",
    "malformed_tool_calls",
    "tool_error_message",
    "tool_error_messages",
]

#: Flag set on a :class:`~agentforge.types.ToolCall` whose empty argument string was read as ``{}``.
EMPTY_ARGUMENTS = "empty_arguments_normalised"
#: Flag set on a :class:`~agentforge.types.ToolCall` whose arguments are not a JSON object.
MALFORMED_ARGUMENTS = "malformed_arguments"


def parse_tool_arguments(raw: str | None) -> tuple[dict[str, Any] | None, list[str], str | None]:
    """Decode a tool call's argument string by the rules in the module docstring.

    Args:
        raw: the ``function.arguments`` string as the engine sent it (``None`` counts as empty).

    Returns:
        ``(parsed, flags, problem)``: the decoded object (``None`` when malformed), the flags to record,
        and a one-line description of what is wrong (``None`` when nothing is).
    """
    if raw is None or not raw.strip():
        return {}, [EMPTY_ARGUMENTS], None
    try:
        value = json.loads(raw, strict=False)  # strict=False: raw newlines inside strings are accepted
    except (json.JSONDecodeError, RecursionError) as exc:
        problem = str(exc) if isinstance(exc, json.JSONDecodeError) else "nesting too deep"
        return None, [MALFORMED_ARGUMENTS], f"not valid JSON ({problem})"
    if not isinstance(value, dict):
        return None, [MALFORMED_ARGUMENTS], f"a JSON {type(value).__name__}, not an object"
    return value, [], None


def tool_call_from_openai(call: Mapping[str, Any] | Any) -> ToolCall:
    """Build a :class:`~agentforge.types.ToolCall` from an OpenAI-format tool call.

    Args:
        call: a dict ``{"id", "type", "function": {"name", "arguments"}}`` or the OpenAI SDK object.

    Returns:
        The tool call with ``arguments`` verbatim and ``parsed``/``flags`` set by the module rules.
    """
    if not isinstance(call, Mapping):
        call = call.model_dump() if hasattr(call, "model_dump") else dict(vars(call))
    function = call.get("function") or {}
    raw = function.get("arguments")
    parsed, flags, _ = parse_tool_arguments(raw)
    return ToolCall(
        id=call.get("id"), name=function.get("name") or "", arguments=raw or "", parsed=parsed, flags=flags
    )


def _calls_of(message: Mapping[str, Any] | Any) -> list[Any]:
    if isinstance(message, Mapping):
        return list(message.get("tool_calls") or [])
    return list(getattr(message, "tool_calls", None) or [])


def malformed_tool_calls(message: Mapping[str, Any] | Any) -> list[ToolCall]:
    """The tool calls of an assistant message whose arguments cannot be used.

    Args:
        message: an assistant message as a dict or an OpenAI SDK ``ChatCompletionMessage``.

    Returns:
        The calls flagged ``malformed_arguments``, in message order.
    """
    calls = [tool_call_from_openai(c) for c in _calls_of(message)]
    return [c for c in calls if MALFORMED_ARGUMENTS in c.flags]


def tool_error_message(call: ToolCall) -> dict[str, Any]:
    """A ``role: tool`` message telling the model its call could not be executed.

    Args:
        call: a tool call whose arguments are malformed.

    Returns:
        ``{"role": "tool", "tool_call_id": call.id, "content": "Error: ..."}``; the content quotes the
        raw arguments (first 200 characters) and asks for a JSON object.
    """
    _, _, problem = parse_tool_arguments(call.arguments)
    shown = call.arguments if len(call.arguments) <= 200 else call.arguments[:200] + "…"
    return {
        "role": "tool",
        "tool_call_id": call.id or "",
        "content": (
            f"Error: the arguments of tool {call.name!r} are {problem or 'unusable'}: {shown}. "
            "Call the tool again with a single JSON object as arguments."
        ),
    }


def tool_error_messages(message: Mapping[str, Any] | Any) -> list[dict[str, Any]]:
    """One tool-error message per malformed tool call of an assistant message.

    Args:
        message: an assistant message as a dict or an OpenAI SDK ``ChatCompletionMessage``.

    Returns:
        Messages to append after the assistant message (empty when every call is usable).
    """
    return [tool_error_message(c) for c in malformed_tool_calls(message)]


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split model text into content and OpenAI tool calls, as vLLM's ``hermes`` parser does.

    Args:
        text: the decoded completion.

    Returns:
        ``(content, tool_calls)``; text without a parsable ``<tool_call>`` comes back unchanged with no calls,
        and content before the first tag is ``None`` when empty.
    """
    if "<tool_call>" not in text:
        return text, []
    try:
        calls = [json.loads(a or b) for a, b in _TOOL_CALL.findall(text)]
        tool_calls = [
            {
                "id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}",
                "type": "function",
                "function": {
                    "name": c["name"],
                    "arguments": json.dumps(c.get("arguments", {}), ensure_ascii=False),
                },
            }
            for c in calls
        ]
    except (ValueError, KeyError, TypeError):
        return text, []
    return text[: text.index("<tool_call>")] or None, tool_calls
