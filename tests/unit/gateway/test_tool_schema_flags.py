"""Issue 18: a tool call whose arguments do not follow its tool's ``parameters`` schema is flagged on the span.

The rules (``agentforge.toolcalls``): an unknown tool name → ``unknown_tool``; an argument key the schema does
not list (an object schema without ``additionalProperties`` is closed, as vLLM's guided decoding treats it), a
missing required key or a wrong type → ``arguments_not_in_schema``; the span gets ``tool_arguments_invalid`` and
stays trainable. Through the real gateway app, streamed and not, with the call passed on unchanged.
"""

from __future__ import annotations

import json

import pytest
from gateway_helpers import CHAT, parse_sse, streamed_arguments

from agentforge.testing import ScriptedToolCall, ScriptedTurn
from agentforge.toolcalls import (
    ARGUMENTS_NOT_IN_SCHEMA,
    TOOL_ARGUMENTS_INVALID,
    UNKNOWN_TOOL,
    check_tool_schemas,
    schema_problem,
    tool_call_from_openai,
    tool_error_messages,
)

FIND = {
    "type": "function",
    "function": {
        "name": "find_book",
        "description": "Look a book up by its title.",
        "parameters": {
            "type": "object",
            "properties": {"title": {"type": "string"}, "copies": {"type": "integer"}},
            "required": ["title"],
        },
    },
}
OPEN = {
    "type": "function",
    "function": {"name": "note", "parameters": {"type": "object", "additionalProperties": True}},
}
BARE = {"type": "function", "function": {"name": "ping"}}  # no parameters: takes none
TOOLS = [FIND, OPEN, BARE]


def _call(name: str, arguments: str) -> dict[str, object]:
    return {"id": "call-1", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("name", "arguments", "flag", "says"),
    [
        ("find_book", '{"title": "Dune"}', None, None),
        ("find_book", '{"title": "Dune", "copies": 2}', None, None),
        ("find_book", '{"title": "Dune", "author": "Herbert"}', ARGUMENTS_NOT_IN_SCHEMA, "'author'"),
        ("find_book", '{"copies": 1}', ARGUMENTS_NOT_IN_SCHEMA, "'title' is a required property"),
        ("find_book", '{"title": 7}', ARGUMENTS_NOT_IN_SCHEMA, "at title: 7 is not of type 'string'"),
        ("note", '{"anything": [1, 2]}', None, None),  # additionalProperties: true keeps it open
        ("ping", "", None, None),
        ("ping", '{"x": 1}', ARGUMENTS_NOT_IN_SCHEMA, "no arguments"),
        ("lend_book", '{"title": "Dune"}', UNKNOWN_TOOL, "unknown tool 'lend_book'"),
        ("find_book", '{"title": "Du', None, None),  # malformed: flagged malformed_arguments, not here
    ],
)
def test_the_rules(name: str, arguments: str, flag: str | None, says: str | None) -> None:
    call = tool_call_from_openai(_call(name, arguments))
    assert check_tool_schemas([call], TOOLS) is (flag is not None)
    assert [f for f in call.flags if f in (ARGUMENTS_NOT_IN_SCHEMA, UNKNOWN_TOOL)] == ([flag] if flag else [])
    problem = schema_problem(call, {t["function"]["name"]: t["function"].get("parameters") for t in TOOLS})
    if says is None:
        assert problem is None or "malformed_arguments" in call.flags
    else:
        assert problem is not None and says in problem, problem
        (error,) = tool_error_messages({"role": "assistant", "tool_calls": [_call(name, arguments)]}, TOOLS)
        assert error["tool_call_id"] == "call-1" and says in error["content"]


def test_nothing_is_checked_without_tools_and_an_invalid_schema_is_left_to_the_engine() -> None:
    call = tool_call_from_openai(_call("find_book", '{"author": "x"}'))
    assert not check_tool_schemas([call], None) and call.flags == []
    weird = [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}},
        }
    ]
    assert not check_tool_schemas([tool_call_from_openai(_call("f", '{"a": 1}'))], weird)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("arguments", "invalid"), [('{"title": "Dune"}', False), ('{"title": "Dune", "shelf": "A3"}', True)]
)
async def test_the_span_is_flagged_and_the_call_passes_unchanged(
    make_gateway, gw_client_for, gw_store, stream: bool, arguments: str, invalid: bool
) -> None:
    app, _ = make_gateway([ScriptedTurn(tool_calls=[ScriptedToolCall("find_book", arguments, id="call-1")])])
    body = {**CHAT, "tools": TOOLS, "tool_choice": "required", "stream": stream}
    r = await gw_client_for(app).post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    if stream:
        received = streamed_arguments(parse_sse(r.text))[0]
    else:
        received = r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(received) == json.loads(arguments)  # never rewritten
    (span,) = gw_store.list_spans(orphans=True)
    (call,) = span.llm.tool_calls
    assert (TOOL_ARGUMENTS_INVALID in span.llm.flags) is invalid and span.llm.trainable
    assert (ARGUMENTS_NOT_IN_SCHEMA in call.flags) is invalid


def test_a_strict_tool_makes_the_call_guided() -> None:
    """vLLM pins a ``strict`` tool's arguments by grammar even under ``"auto"``: its logprobs are recomputed."""
    from agentforge.gateway.guided import is_guided

    strict = [{**FIND, "function": {**FIND["function"], "strict": True}}]
    assert not is_guided({"tools": TOOLS}) and not is_guided({"tools": TOOLS, "tool_choice": "auto"})
    assert is_guided({"tools": strict}) and is_guided({"tools": strict, "tool_choice": "auto"})
    assert is_guided({"tools": [{**FIND, "strict": True}]})
    assert not is_guided({"tools": strict, "tool_choice": "none"})
