"""A plain OpenAI-SDK customer-service agent with one tool. It imports nothing of agentforge.

Point it at any OpenAI-compatible endpoint; pointed at the agentforge gateway
(``{gateway}/rollouts/{rollout_id}/v1``), every call it makes is recorded token-exactly.

    python examples/openai_sdk_agent.py --base-url http://127.0.0.1:8000/v1 --model policy
"""

from __future__ import annotations

import argparse
import json

from openai import OpenAI

ORDERS = {
    "W0001": "shipped, 2 books",
    "W0002": "cancelled, 1 kettle",
    "W1001": "delivered, 1 water bottle",
    "W2002": "pending, 1 desk lamp",
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_status",
            "description": "Look up the status of an order by its id.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string", "description": "Order id such as W1001."}},
                "required": ["order_id"],
            },
        },
    }
]

SYSTEM = "You are a customer-service agent. Use get_order_status to look up orders. Answer briefly."


def _worked_example(order_id: str) -> list[dict]:
    """One worked exchange (user → tool call → tool result → answer): tiny models copy the pattern."""
    call_id = f"call_{order_id.lower()}"
    status = ORDERS[order_id]
    return [
        {"role": "user", "content": f"Where is my order {order_id}?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_order_status", "arguments": json.dumps({"order_id": order_id})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": status},
        {"role": "assistant", "content": f"Your order {order_id} is {status.split(',')[0]}."},
    ]


#: Two worked examples in front of the real conversation.
FEW_SHOT = _worked_example("W0001") + _worked_example("W0002")


def get_order_status(order_id: str) -> str:
    """The tool: the order's status, or an error message the model can read."""
    status = ORDERS.get(order_id.strip().lstrip("#"))
    return status if status else f"Error: order {order_id!r} not found"


def run_tool(call) -> str:  # noqa: ANN001 - an openai tool-call object
    """Execute one tool call; malformed arguments become an error message for the model, never a crash."""
    try:
        args = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as exc:
        return f"Error: arguments are not valid JSON ({exc.msg}); call the tool again with a JSON object"
    if call.function.name != "get_order_status":
        return f"Error: unknown tool {call.function.name!r}"
    return get_order_status(str(args.get("order_id", "")))


def converse(client: OpenAI, model: str, user_turns: list[str], max_tokens: int = 48) -> list[dict]:
    """Run a conversation: one assistant answer per user turn, executing tool calls in between.

    Greedy decoding with a fixed seed, so runs are repeatable; at most 3 model calls per user turn.

    Returns: the full message list (system prompt and worked examples first).
    """
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, *FEW_SHOT]
    for text in user_turns:
        messages.append({"role": "user", "content": text})
        for _ in range(3):
            out = client.chat.completions.create(
                model=model, messages=messages, tools=TOOLS, max_tokens=max_tokens, temperature=0.0, seed=0
            )
            msg = out.choices[0].message
            entry: dict = {"role": "assistant", "content": msg.content}
            if msg.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in msg.tool_calls
                ]
            messages.append(entry)
            if not msg.tool_calls:
                break
            for call in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call)})
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="policy")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused-on-loopback")
    turns = ["Where is my order W1001?", "Where is my order W2002?", "Thank you, goodbye."]
    for m in converse(client, args.model, turns)[1 + len(FEW_SHOT) :]:
        print(f"{m['role']:>9}: {m.get('content') or m.get('tool_calls')}")


if __name__ == "__main__":
    main()
