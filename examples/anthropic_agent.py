"""An Anthropic-SDK customer-service agent with one tool. It imports nothing of agentforge.

A plain tool loop on ``anthropic.Anthropic().messages.create``: the model asks for ``get_order_status`` with a
``tool_use`` block, the agent runs it and sends a ``tool_result`` block back. Pointed at the agentforge gateway
(base URL ``{gateway}/rollouts/{rollout_id}``, the gateway's Messages API), every call it makes is recorded
token-exactly; the agent code does not change. The conversation starts with worked examples so a tiny model
copies the pattern.

    python examples/anthropic_agent.py --base-url http://127.0.0.1:8000/v1 --model policy
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import anthropic

ORDERS = {
    "W0001": "shipped, 2 books",
    "W0002": "cancelled, 1 kettle",
    "W1001": "delivered, 1 water bottle",
    "W2002": "pending, 1 desk lamp",
}

SYSTEM = "You are a customer-service agent. Use get_order_status to look up orders. Answer briefly."

TOOLS = [
    {
        "name": "get_order_status",
        "description": "Look up the status of an order by its id.",
        "input_schema": {
            "type": "object",
            "properties": {"order_id": {"type": "string", "description": "Order id such as W1001."}},
            "required": ["order_id"],
        },
    }
]


def get_order_status(order_id: str) -> str:
    """The tool: the order's status, or an error message the model can read."""
    status = ORDERS.get(str(order_id).strip().lstrip("#"))
    return status if status else f"Error: order {order_id!r} not found"


def worked_example(order_id: str) -> list[dict[str, Any]]:
    """One worked exchange in the Messages API's blocks (user → tool_use → tool_result → answer)."""
    call_id = f"toolu_{order_id.lower()}"
    status = ORDERS[order_id]
    return [
        {"role": "user", "content": f"Where is my order {order_id}?"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": call_id,
                    "name": "get_order_status",
                    "input": {"order_id": order_id},
                }
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": status}]},
        {"role": "assistant", "content": f"Your order {order_id} is {status.split(',')[0]}."},
    ]


def converse(base_url: str, model: str, user_turns: list[str], max_tokens: int = 48) -> dict[str, Any]:
    """Run one conversation: one answer per user turn, running tool calls in between (at most 3 model calls a
    turn; greedy decoding).

    Args:
        base_url: the API's base URL; a trailing ``/v1`` is dropped (the SDK adds ``/v1/messages`` itself).
        model: the model name to ask for (the gateway's alias, e.g. ``policy``).
        user_turns: what the user says, in order.
        max_tokens: completion limit per model call, tokens.

    Returns:
        ``{"replies": [str, ...], "tool_calls": [{"name", "arguments", "result"}, ...]}``.
    """
    client = anthropic.Anthropic(
        base_url=base_url.removesuffix("/").removesuffix("/v1"), api_key="unused-on-loopback", max_retries=0
    )
    messages: list[dict[str, Any]] = worked_example("W0001") + worked_example("W0002")
    replies: list[str] = []
    calls: list[dict[str, Any]] = []
    for text in user_turns:
        messages.append({"role": "user", "content": text})
        reply = ""
        for _ in range(3):
            answer = client.messages.create(
                model=model,
                system=SYSTEM,
                messages=messages,
                tools=TOOLS,
                max_tokens=max_tokens,
                extra_body={"temperature": 0.0},
            )
            blocks = [b.model_dump(exclude_none=True) for b in answer.content]
            messages.append({"role": "assistant", "content": blocks})
            reply = "".join(b.get("text", "") for b in blocks if b["type"] == "text")
            uses = [b for b in blocks if b["type"] == "tool_use"]
            if not uses:
                break
            results = []
            for use in uses:
                result = (
                    get_order_status(use["input"].get("order_id", ""))
                    if use["name"] == "get_order_status"
                    else f"Error: unknown tool {use['name']!r}"
                )
                calls.append({"name": use["name"], "arguments": json.dumps(use["input"]), "result": result})
                results.append({"type": "tool_result", "tool_use_id": use["id"], "content": result})
            messages.append({"role": "user", "content": results})
        replies.append(reply)
    return {"replies": replies, "tool_calls": calls}


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
    outcome = converse(args.base_url, args.model, turns, args.max_tokens)
    if args.json:
        print(json.dumps(outcome))
        return
    for call in outcome["tool_calls"]:
        print(f"     tool: {call['name']}({call['arguments']}) -> {call.get('result')}")
    for text, reply in zip(turns, outcome["replies"], strict=True):
        print(f"     user: {text}\nassistant: {reply}")


if __name__ == "__main__":
    main()
