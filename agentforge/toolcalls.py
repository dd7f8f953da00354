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
* Against the request's ``tools`` (:func:`check_tool_schemas`; the gateway's capture runs it on every answer):
  a call naming no listed tool gets ``unknown_tool``; arguments that do not validate against the tool's
  ``parameters`` JSON Schema (``jsonschema``), or that carry a top-level key the schema does not list, get
  ``arguments_not_in_schema`` — an object schema without ``additionalProperties`` counts as closed, as vLLM's
  guided decoding (xgrammar's strict mode) and OpenAI's strict function calling treat it. The span then carries
  ``tool_arguments_invalid``; it stays trainable (the model sampled those tokens, the reward judges them).

Why forced calls can still break a schema: vLLM 0.32's ``hermes`` parser forces the envelope and the tool name of
a ``tool_choice="required"`` / named call with a structural tag, but pins the arguments to ``parameters`` only
for tools marked ``"strict": true`` (``--tool-strict-level auto``); ``"auto"`` calls of other tools and the
embedded backend (which forces nothing) parse whatever the model wrote
(``tests/integration/test_forced_tool_schema_vllm.py`` measures both).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from functools import lru_cache
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
    "UNKNOWN_TOOL",
    "ARGUMENTS_NOT_IN_SCHEMA",
    "TOOL_ARGUMENTS_INVALID",
    "schema_problem",
    "check_tool_schemas",
]

#: Flag set on a :class:`~agentforge.types.ToolCall` whose empty argument string was read as ``{}``.
EMPTY_ARGUMENTS = "empty_arguments_normalised"
#: Flag set on a :class:`~agentforge.types.ToolCall` whose arguments are not a JSON object.
MALFORMED_ARGUMENTS = "malformed_arguments"
#: Flag set on a :class:`~agentforge.types.ToolCall` naming a tool the request did not list.
UNKNOWN_TOOL = "unknown_tool"
#: Flag set on a :class:`~agentforge.types.ToolCall` whose arguments do not follow its tool's ``parameters``.
ARGUMENTS_NOT_IN_SCHEMA = "arguments_not_in_schema"
#: Span (:class:`~agentforge.types.LLMCall`) flag: some tool call is ``unknown_tool`` or ``arguments_not_in_schema``.
TOOL_ARGUMENTS_INVALID = "tool_arguments_invalid"


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


def tool_error_messages(message: Mapping[str, Any] | Any, tools: Any = None) -> list[dict[str, Any]]:
    """One tool-error message per malformed tool call of an assistant message (and, given ``tools``, per call
    that names an unknown tool or breaks its tool's ``parameters`` schema).

    Args:
        message: an assistant message as a dict or an OpenAI SDK ``ChatCompletionMessage``.
        tools: the request's ``tools`` (OpenAI format); ``None`` checks only that arguments are JSON objects.

    Returns:
        Messages to append after the assistant message (empty when every call is usable).
    """
    out = [tool_error_message(c) for c in malformed_tool_calls(message)]
    if tools:
        by_name = _schemas(tools)
        for call in (tool_call_from_openai(c) for c in _calls_of(message)):
            problem = None if MALFORMED_ARGUMENTS in call.flags else schema_problem(call, by_name)
            if problem is not None:
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.id or "",
                        "content": f"Error: {problem}. Call the tool again with arguments that follow its parameters.",
                    }
                )
    return out


def _schemas(tools: Any) -> dict[str, Any]:
    """Tool name → its ``parameters`` schema (``None`` when it declares none), from OpenAI-format ``tools``."""
    out: dict[str, Any] = {}
    for tool in tools if isinstance(tools, list | tuple) else ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            out[function["name"]] = function.get("parameters")
    return out


def schema_problem(call: ToolCall, schemas: Mapping[str, Any]) -> str | None:
    """What is wrong with a parsed tool call against its tool's ``parameters`` (rules: module docstring).

    Args:
        call: the tool call (its ``parsed`` arguments; a malformed call is not checked here).
        schemas: tool name → ``parameters`` JSON Schema (``None``: the tool takes no parameters), e.g. from
            the request's ``tools``.

    Returns:
        One line naming the problem (``unknown tool 'x'``, ``'find_book' does not take key(s) 'foo' (it takes:
        title)``, or the first schema violation), or ``None`` when the call follows its schema.
    """
    if call.name not in schemas:
        return f"unknown tool {call.name!r} (the tools are: {', '.join(sorted(schemas)) or 'none'})"
    if call.parsed is None:
        return None
    schema = schemas[call.name] or {"type": "object", "properties": {}}
    if not isinstance(schema, Mapping):
        return None
    properties = found if isinstance(found := schema.get("properties"), Mapping) else {}
    if schema.get("additionalProperties", False) is False:
        extra = [k for k in call.parsed if k not in properties]
        if extra:
            takes = ", ".join(properties) or "no arguments"
            return f"{call.name!r} does not take key(s) {', '.join(map(repr, extra))} (it takes: {takes})"
    validator = _validator(json.dumps(schema, sort_keys=True))
    if validator is None:
        return None
    error = next(iter(validator.iter_errors(call.parsed)), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return (
        f"the arguments of {call.name!r} break its schema{f' at {where}' if where else ''}: {error.message}"
    )


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    """A ``jsonschema`` validator for one schema (cached: the same tools come with every call of a rollout);
    ``None`` when the schema itself is invalid (the engine, not this check, reports that)."""
    from jsonschema import validators
    from jsonschema.exceptions import SchemaError

    schema = json.loads(schema_json)
    cls = validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError:
        return None
    return cls(schema)


def check_tool_schemas(calls: list[ToolCall], tools: Any) -> bool:
    """Flag each call that names an unknown tool or breaks its tool's schema (``unknown_tool`` /
    ``arguments_not_in_schema`` appended to ``call.flags``, in place).

    Args:
        calls: the answer's tool calls.
        tools: the request's ``tools`` (OpenAI format); nothing is checked when it lists none.

    Returns:
        Whether any call was flagged (the span's :data:`TOOL_ARGUMENTS_INVALID`).
    """
    if not calls or not tools:
        return False
    schemas, flagged = _schemas(tools), False
    for call in calls:
        if MALFORMED_ARGUMENTS in call.flags:
            continue
        problem = schema_problem(call, schemas)
        if problem is not None:
            call.flags.append(UNKNOWN_TOOL if call.name not in schemas else ARGUMENTS_NOT_IN_SCHEMA)
            flagged = True
    return flagged


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
