"""An OpenAI Agents SDK customer-service agent with one tool. It imports nothing of agentforge.

An ``Agent`` with a ``function_tool``, run by ``Runner.run``; its model is the SDK's ``OpenAIResponsesModel`` (the
Responses API, the SDK's default) on an ``AsyncOpenAI`` client pointed at any OpenAI-compatible base URL.
Pointed at the agentforge gateway (``{gateway}/rollouts/{rollout_id}/v1``), every call it makes is recorded
token-exactly; the agent code does not change.

Two details make it work with a small open model: the conversation starts with worked examples (user → function
call → its output → answer) so a tiny model copies the pattern, and tracing to OpenAI's servers is off (the
gateway records every call; nothing leaves the machine).

    python examples/openai_agents_agent.py --base-url http://127.0.0.1:8000/v1 --model policy
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from openai import AsyncOpenAI

from agents import (  # the OpenAI Agents SDK (pip package openai-agents)
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)

ORDERS = {
    "W0001": "shipped, 2 books",
    "W0002": "cancelled, 1 kettle",
    "W1001": "delivered, 1 water bottle",
    "W2002": "pending, 1 desk lamp",
}

SYSTEM = "You are a customer-service agent. Use get_order_status to look up orders. Answer briefly."


@function_tool
def get_order_status(order_id: str) -> str:
    """Look up the status of an order by its id, such as W1001.

    Args:
        order_id: the order id (a leading ``#`` is ignored).
    """
    status = ORDERS.get(order_id.strip().lstrip("#"))
    return status if status else f"Error: order {order_id!r} not found"


def worked_example(order_id: str) -> list[dict[str, Any]]:
    """One worked exchange as Responses input items (user → function call → its output → answer)."""
    call_id = f"call_{order_id.lower()}"
    status = ORDERS[order_id]
    return [
        {"role": "user", "content": f"Where is my order {order_id}?"},
        {
            "type": "function_call",
            "call_id": call_id,
            "name": "get_order_status",
            "arguments": json.dumps({"order_id": order_id}),
        },
        {"type": "function_call_output", "call_id": call_id, "output": status},
        {"role": "assistant", "content": f"Your order {order_id} is {status.split(',')[0]}."},
    ]


async def converse(base_url: str, model: str, user_turns: list[str], max_tokens: int = 48) -> dict[str, Any]:
    """Run one conversation, one ``Runner.run`` per user turn (the history carried between turns).

    Args:
        base_url: an OpenAI-compatible base URL ending in ``/v1``.
        model: the model name to ask for (the gateway's alias, e.g. ``policy``).
        user_turns: what the user says, in order.
        max_tokens: completion limit per model call, tokens.

    Returns:
        ``{"replies": [str, ...], "tool_calls": [{"name", "arguments", "result"}, ...]}``: the agent's final
        output per turn and every tool call it executed.
    """
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key="unused-on-loopback", max_retries=0)
    agent = Agent(
        name="order_agent",
        instructions=SYSTEM,
        tools=[get_order_status],
        model=OpenAIResponsesModel(model=model, openai_client=client),
        model_settings=ModelSettings(temperature=0.0, max_tokens=max_tokens),
    )
    history: list[Any] = worked_example("W0001") + worked_example("W0002")
    replies: list[str] = []
    calls: dict[str, dict[str, Any]] = {}
    try:
        for text in user_turns:
            result = await Runner.run(agent, [*history, {"role": "user", "content": text}], max_turns=4)
            for item in result.new_items:
                if isinstance(item, ToolCallItem):
                    raw = item.raw_item
                    calls[raw.call_id] = {"name": raw.name, "arguments": raw.arguments}  # type: ignore[union-attr]
                elif isinstance(item, ToolCallOutputItem):
                    call_id = item.raw_item["call_id"]  # type: ignore[index]
                    calls.setdefault(call_id, {"name": None, "arguments": None})["result"] = item.output
            replies.append(str(result.final_output))
            history = result.to_input_list()
    finally:
        await client.close()
    return {"replies": replies, "tool_calls": list(calls.values())}


def main() -> None:
    """Command line: run a two-turn conversation and print it (``--json``: one JSON object)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="policy")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--turn", action="append", help="a user turn (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    args = parser.parse_args()
    turns = args.turn or ["Where is my order W1001?", "Thank you, goodbye."]
    outcome = asyncio.run(converse(args.base_url, args.model, turns, args.max_tokens))
    if args.json:
        print(json.dumps(outcome))
        return
    for call in outcome["tool_calls"]:
        print(f"     tool: {call['name']}({call['arguments']}) -> {call.get('result')}")
    for text, reply in zip(turns, outcome["replies"], strict=True):
        print(f"     user: {text}\nassistant: {reply}")


if __name__ == "__main__":
    main()
