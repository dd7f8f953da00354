"""An AutoGen AgentChat customer-service agent with one tool. It imports nothing of agentforge.

An ``AssistantAgent`` whose model client is AutoGen's ``OpenAIChatCompletionClient`` pointed at any
OpenAI-compatible endpoint. Pointed at the agentforge gateway (``{gateway}/rollouts/{rollout_id}/v1``),
every call it makes is recorded token-exactly; the agent code does not change.

Two details make it work with a small open model behind the gateway:

* ``model_info`` declares what the model can do: AutoGen only knows OpenAI's model names, and the gateway
  serves an alias (``policy``).
* The model context starts with worked examples (user → tool call → tool result → answer), so a tiny
  model copies the pattern and calls the tool.

Run it in its own environment (``autogen-agentchat`` pins ``protobuf~=5.29``; see ``scripts/setup.sh``)::

    .venv-autogen/bin/python examples/autogen_agent.py --base-url http://127.0.0.1:8000/v1 --model policy
"""

from __future__ import annotations

import argparse
import asyncio
import json
import warnings
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import ToolCallExecutionEvent, ToolCallRequestEvent
from autogen_core import FunctionCall
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import (
    AssistantMessage,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    ModelInfo,
    UserMessage,
)
from autogen_ext.models.openai import OpenAIChatCompletionClient

ORDERS = {
    "W0001": "shipped, 2 books",
    "W0002": "cancelled, 1 kettle",
    "W1001": "delivered, 1 water bottle",
    "W2002": "pending, 1 desk lamp",
}

SYSTEM = "You are a customer-service agent. Use get_order_status to look up orders. Answer briefly."

#: What the served model can do (AutoGen cannot infer it from a name such as ``policy``).
MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False
)


def get_order_status(order_id: str) -> str:
    """Look up the status of an order by its id, such as W1001.

    Args:
        order_id: the order id (a leading ``#`` is ignored).

    Returns:
        The status, or an error message the model can read.
    """
    status = ORDERS.get(order_id.strip().lstrip("#"))
    return status if status else f"Error: order {order_id!r} not found"


def worked_example(order_id: str) -> list[LLMMessage]:
    """One worked exchange (user → tool call → tool result → answer) in AutoGen's message types."""
    call_id = f"call_{order_id.lower()}"
    status = ORDERS[order_id]
    arguments = json.dumps({"order_id": order_id})
    return [
        UserMessage(content=f"Where is my order {order_id}?", source="user"),
        AssistantMessage(
            content=[FunctionCall(id=call_id, name="get_order_status", arguments=arguments)], source="agent"
        ),
        FunctionExecutionResultMessage(
            content=[FunctionExecutionResult(call_id=call_id, name="get_order_status", content=status)]
        ),
        AssistantMessage(content=f"Your order {order_id} is {status.split(',')[0]}.", source="agent"),
    ]


def build_client(base_url: str, model: str, max_tokens: int = 48) -> OpenAIChatCompletionClient:
    """The model client: greedy decoding with a fixed seed.

    Args:
        base_url: an OpenAI-compatible base URL ending in ``/v1``.
        model: the model name to ask for (the gateway's alias, e.g. ``policy``).
        max_tokens: completion limit per model call, tokens.
    """
    return OpenAIChatCompletionClient(
        model=model,
        base_url=base_url,
        api_key="unused-on-loopback",
        model_info=MODEL_INFO,
        temperature=0.0,
        seed=0,
        max_tokens=max_tokens,
    )


def build_agent(client: OpenAIChatCompletionClient) -> AssistantAgent:
    """The agent: the tool, two worked examples in its context, one more model call after a tool call.

    Args:
        client: the model client (see :func:`build_client`).
    """
    context = UnboundedChatCompletionContext(
        initial_messages=worked_example("W0001") + worked_example("W0002")
    )
    return AssistantAgent(
        "order_agent",
        model_client=client,
        tools=[get_order_status],
        model_context=context,
        system_message=SYSTEM,
        reflect_on_tool_use=True,
    )


async def converse(base_url: str, model: str, user_turns: list[str], max_tokens: int = 48) -> dict[str, Any]:
    """Run one conversation, one ``agent.run`` per user turn (the agent keeps its context between turns).

    Args:
        base_url: an OpenAI-compatible base URL ending in ``/v1``.
        model: the model name to ask for.
        user_turns: what the user says, in order.
        max_tokens: completion limit per model call, tokens.

    Returns:
        ``{"replies": [str, ...], "tool_calls": [{"name", "arguments", "result", "is_error"}, ...]}``:
        the agent's last message per turn and every tool call it executed.
    """
    client = build_client(base_url, model, max_tokens)
    agent = build_agent(client)
    replies: list[str] = []
    calls: dict[str, dict[str, Any]] = {}
    try:
        for text in user_turns:
            result = await agent.run(task=text)
            for message in result.messages:
                if isinstance(message, ToolCallRequestEvent):
                    for call in message.content:
                        calls[call.id] = {"name": call.name, "arguments": call.arguments}
                elif isinstance(message, ToolCallExecutionEvent):
                    for done in message.content:
                        entry = calls.setdefault(done.call_id, {"name": done.name, "arguments": None})
                        entry.update(result=done.content, is_error=bool(done.is_error))
            replies.append(result.messages[-1].to_text())
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
    # The gateway answers with the version that served the call (``policy@v3``), not the alias asked for.
    warnings.filterwarnings("ignore", message="Resolved model mismatch")
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
