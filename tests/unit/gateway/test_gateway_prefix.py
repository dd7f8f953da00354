"""Token-in continuations (agentforge.gateway.prefix): which follow-up calls continue a remembered call, the ids
they are built from, and the chat answer made from the engine's completions answer. The whole path against
real engines is in tests/integration/test_gateway_prefix_engines.py."""

from __future__ import annotations

import json

from agentforge.gateway.call import CallContext
from agentforge.gateway.capture import TOOL_CALL_TRUNCATED, llm_call_from_response
from agentforge.gateway.guided import is_guided
from agentforge.gateway.prefix import BREAK_PREFIX, Continuations, _glue
from agentforge.gateway.prefix_wire import chat_answer
from agentforge.ports import BatchReport
from agentforge.types import LLMCall, ToolCall

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
IM_END, NL = 2, 198


def _call(
    prompt: list[int], completion: list[int], text: str = "", calls: list[ToolCall] | None = None
) -> LLMCall:
    return LLMCall(
        model="policy",
        version="policy@v0",
        endpoint="chat",
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-0.5] * len(completion),
        response_text=text,
        tool_calls=calls or [],
    )


def _remembered() -> tuple[Continuations, list[dict], LLMCall]:
    memory = Continuations()
    first = [{"role": "user", "content": "Weather in Paris?"}]
    ctx = CallContext("chat", {"model": "policy", "messages": first, "tools": TOOLS}, "ro-1", None)
    call = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris", "unit": "C"}')
    llm = _call([1, 5, 6], [7, 8, IM_END], calls=[call])
    memory.remember(ctx, llm)
    return memory, first, llm


def _echo(arguments: str, content: str | None = None) -> dict:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        ],
    }


def test_a_history_echoed_with_reformatted_arguments_continues_the_remembered_call() -> None:
    memory, first, llm = _remembered()
    # what LangChain sends back: arguments parsed and dumped again (other key order, spacing), content ""
    echoed = _echo(json.dumps({"unit": "C", "city": "Paris"}, indent=1), content="")
    body = {
        "model": "policy",
        "tools": TOOLS,
        "messages": [*first, echoed, {"role": "tool", "content": "sunny"}],
    }
    assert memory.wants(CallContext("chat", body, "ro-1", None))
    turn = memory._match(body, memory._turns["ro-1"])
    assert turn is not None and turn.llm is llm


def test_a_changed_history_other_tools_or_no_new_message_do_not_continue() -> None:
    memory, first, _ = _remembered()
    echoed = _echo('{"city": "Paris", "unit": "C"}')
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    turns = memory._turns["ro-1"]
    other_user = [{"role": "user", "content": "Weather in Rome?"}]
    assert memory._match({"messages": [*other_user, echoed, tool], "tools": TOOLS}, turns) is None
    other_args = _echo('{"city": "Rome", "unit": "C"}')
    assert memory._match({"messages": [*first, other_args, tool], "tools": TOOLS}, turns) is None
    assert memory._match({"messages": [*first, echoed, tool], "tools": []}, turns) is None
    assert memory._match({"messages": [*first, echoed], "tools": TOOLS}, turns) is None
    assert memory._match({"messages": [*first, echoed, tool], "tools": TOOLS}, turns) is not None
    assert not memory.wants(CallContext("chat", {"messages": first}, "ro-other", None))
    assert not memory.wants(CallContext("chat", {"messages": first}, None, None))


def test_the_closing_after_a_turn_is_added_except_what_the_model_sampled() -> None:
    closing = [IM_END, NL]  # ChatML: <|im_end|>\n
    assert _glue([7, 8, IM_END], closing) == [NL]  # stopped on its own end-of-turn token
    assert _glue([7, 8, 9], closing) == [IM_END, NL]  # cut by the token limit: the turn is closed for it
    assert _glue([], closing) == [IM_END, NL]


def test_only_trainable_chat_calls_of_a_rollout_are_remembered_and_break_reasons_reach_the_span() -> None:
    memory = Continuations(max_rollouts=2, turns_per_rollout=2)
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    memory.remember(CallContext("chat", body, None, None), _call([1], [2]))  # orphan
    memory.remember(CallContext("completions", body, "ro-c", None), _call([1], [2]))
    untrainable = _call([1], [2])
    untrainable.trainable = False
    memory.remember(CallContext("chat", body, "ro-u", None), untrainable)
    assert len(memory) == 0
    for rollout in ("ro-1", "ro-2", "ro-3"):  # an LRU of two rollouts
        for _ in range(3):
            memory.remember(CallContext("chat", body, rollout, None), _call([1], [2]))
    assert list(memory._turns) == ["ro-2", "ro-3"] and len(memory._turns["ro-3"]) == 2
    ctx = CallContext("chat", body, "ro-3", None)
    memory._break(ctx, "history")
    llm = _call([1], [2])
    memory.remember(ctx, llm)
    assert llm.flags == [BREAK_PREFIX + "history"]


def test_a_completions_answer_becomes_the_chat_answer_vllm_gives() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    data = {
        "id": "cmpl-abc",
        "created": 1,
        "model": "base",
        "choices": [
            {
                "index": 0,
                "text": text,
                "token_ids": [7, 8, IM_END],
                "prompt_token_ids": [1, 5, 6],
                "finish_reason": "stop",
                "stop_reason": None,
                "logprobs": {
                    "tokens": ["<", "x", ""],
                    "token_logprobs": [-0.1, -0.2, -0.3],
                    "top_logprobs": None,
                },
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
    }
    answer = chat_answer(data, {"tools": TOOLS})
    choice = answer["choices"][0]
    assert answer["prompt_token_ids"] == [1, 5, 6] and choice["token_ids"] == [7, 8, IM_END]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    llm = llm_call_from_response(
        answer, endpoint="chat", request={"tools": TOOLS}, model="policy", version="v"
    )
    assert (
        llm.trainable and llm.logprobs == [-0.1, -0.2, -0.3] and llm.tool_calls[0].parsed == {"city": "Paris"}
    )
    plain = chat_answer(data, {"tools": TOOLS, "tool_choice": "none"})["choices"][0]
    assert plain["message"] == {"role": "assistant", "content": text} and plain["finish_reason"] == "stop"


def test_a_tool_call_cut_by_the_token_limit_is_flagged() -> None:
    cut = '<tool_call>\n{"name": "get_weather", "argu'
    answer = {
        "prompt_token_ids": [1],
        "choices": [
            {
                "message": {"content": cut},
                "finish_reason": "length",
                "token_ids": [5],
                "logprobs": {"content": []},
            }
        ],
    }
    flagged = llm_call_from_response(
        answer, endpoint="chat", request={"tools": TOOLS}, model="p", version="v"
    )
    assert TOOL_CALL_TRUNCATED in flagged.flags
    plain = llm_call_from_response(answer, endpoint="chat", request={}, model="p", version="v")
    assert TOOL_CALL_TRUNCATED not in plain.flags  # no tools offered: a text answer cut short, not a call
    answer["choices"][0]["finish_reason"] = "stop"
    done = llm_call_from_response(answer, endpoint="chat", request={"tools": TOOLS}, model="p", version="v")
    assert TOOL_CALL_TRUNCATED not in done.flags


def test_splits_reach_the_batch_metrics() -> None:
    report = BatchReport(rollouts=4, extra_trajectories=3, split_rollouts=2)
    metrics = report.metrics()
    assert metrics["batch/extra_trajectories"] == 3.0 and metrics["batch/split_share"] == 0.5


def test_guided_calls_are_the_ones_sampled_under_a_grammar() -> None:
    assert is_guided({"tools": TOOLS, "tool_choice": "required"})
    assert is_guided(
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    )
    assert is_guided({"response_format": {"type": "json_schema", "json_schema": {}}})
    assert is_guided({"structured_outputs": {"json": {}}})
    assert not is_guided({"tools": TOOLS, "tool_choice": "auto"}) and not is_guided({"tools": TOOLS})
    assert not is_guided({"tool_choice": "required"})  # no tools: vLLM refuses it, nothing is sampled
    assert not is_guided({"response_format": {"type": "text"}})
    memory = Continuations()
    assert memory.wants(CallContext("chat", {"tools": TOOLS, "tool_choice": "required"}, "ro-1", None))
    assert not memory.wants(CallContext("chat", {"tools": TOOLS, "tool_choice": "required"}, None, None))


def test_the_memory_holds_at_most_max_ids_token_ids_forgetting_the_least_recently_used_rollouts() -> None:
    """A byte bound, not only a count: remembered calls keep their prompt and completion ids, so a few rollouts
    with long prompts could hold gigabytes under ``max_rollouts`` alone. Past ``max_ids`` ids (all rollouts
    together) the least recently used rollouts are forgotten — never the one just kept, even alone over it."""
    memory = Continuations(max_ids=100)
    messages = [{"role": "user", "content": "hi"}]

    def remember(rollout: str, prompt: int, completion: int = 10) -> None:
        ctx = CallContext("chat", {"model": "policy", "messages": messages}, rollout, None)
        memory.remember(ctx, _call(list(range(prompt)), list(range(completion))))

    remember("ro-a", 20)  # 30 ids
    remember("ro-b", 20)  # 60
    remember("ro-c", 20)  # 90
    assert len(memory) == 3
    remember("ro-a", 30)  # a's second call: a holds 30 + 40, so 130 > 100: b (least recently used) goes
    assert [r for r in ("ro-a", "ro-b", "ro-c") if memory.wants(_ctx(r))] == ["ro-a", "ro-c"]
    remember("ro-d", 150)  # alone over the bound: every other rollout goes, d stays
    assert [r for r in ("ro-a", "ro-c", "ro-d") if memory.wants(_ctx(r))] == ["ro-d"] and len(memory) == 1
    remember("ro-e", 5)  # 15 ids: d (160) goes, e stays
    assert [r for r in ("ro-d", "ro-e") if memory.wants(_ctx(r))] == ["ro-e"]


def _ctx(rollout: str) -> CallContext:
    return CallContext(
        "chat", {"model": "policy", "messages": [{"role": "user", "content": "x"}]}, rollout, None
    )
