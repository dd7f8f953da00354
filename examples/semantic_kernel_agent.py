"""A Semantic Kernel customer-service agent with one plugin. It imports nothing of agentforge.

A ``ChatCompletionAgent`` whose service is SK's ``OpenAIChatCompletion`` over an ``AsyncOpenAI`` client
pointed at any OpenAI-compatible endpoint. Pointed at the agentforge gateway
(``{gateway}/rollouts/{rollout_id}/v1``), every call it makes is recorded token-exactly; the agent code
does not change.

The conversation thread starts with worked examples (user → tool call → tool result → answer), so a tiny
model copies the pattern and calls the plugin. SK names the tool ``<plugin>-<function>``
(here ``orders-get_order_status``).

Run it in its own environment (``semantic-kernel`` 1.45 pins ``pydantic<2.14`` and ``mcp<2``; see
``scripts/setup.sh``)::

    .venv-sk/bin/python examples/semantic_kernel_agent.py --base-url http://127.0.0.1:8000/v1 --model policy
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Annotated, Any

from openai import AsyncOpenAI
from semantic_kernel import Kernel
from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread
from semantic_kernel.connectors.ai.function_choice_behavior import FunctionChoiceBehavior
from semantic_kernel.connectors.ai.open_ai import OpenAIChatCompletion, OpenAIChatPromptExecutionSettings
from semantic_kernel.contents import (
    AuthorRole,
    ChatHistory,
    ChatMessageContent,
    FunctionCallContent,
    FunctionResultContent,
)
from semantic_kernel.functions import KernelArguments, kernel_function

ORDERS = {
    "W0001": "shipped, 2 books",
    "W0002": "cancelled, 1 kettle",
    "W1001": "delivered, 1 water bottle",
    "W2002": "pending, 1 desk lamp",
}

SYSTEM = "You are a customer-service agent. Use get_order_status to look up orders. Answer briefly."
PLUGIN = "orders"


class OrderPlugin:
    """The plugin: order look-ups."""

    @kernel_function(name="get_order_status", description="Look up the status of an order by its id.")
    def get_order_status(
        self, order_id: Annotated[str, "Order id such as W1001."]
    ) -> Annotated[str, "The order's status"]:
        """The status, or an error message the model can read."""
        status = ORDERS.get(order_id.strip().lstrip("#"))
        return status if status else f"Error: order {order_id!r} not found"


def worked_example(order_id: str) -> list[ChatMessageContent]:
    """One worked exchange (user → tool call → tool result → answer) in SK's content types."""
    call_id = f"call_{order_id.lower()}"
    status = ORDERS[order_id]
    names = {"plugin_name": PLUGIN, "function_name": "get_order_status"}
    return [
        ChatMessageContent(role=AuthorRole.USER, content=f"Where is my order {order_id}?"),
        ChatMessageContent(
            role=AuthorRole.ASSISTANT,
            items=[FunctionCallContent(id=call_id, arguments=json.dumps({"order_id": order_id}), **names)],
        ),
        ChatMessageContent(
            role=AuthorRole.TOOL, items=[FunctionResultContent(id=call_id, result=status, **names)]
        ),
        ChatMessageContent(
            role=AuthorRole.ASSISTANT, content=f"Your order {order_id} is {status.split(',')[0]}."
        ),
    ]


def build_agent(client: AsyncOpenAI, model: str, max_tokens: int = 48) -> ChatCompletionAgent:
    """The agent: greedy decoding with a fixed seed; at most two rounds of automatic tool calls per turn.

    Args:
        client: an ``AsyncOpenAI`` client whose ``base_url`` is the endpoint (e.g. the gateway).
        model: the model name to ask for (the gateway's alias, e.g. ``policy``).
        max_tokens: completion limit per model call, tokens.
    """
    settings = OpenAIChatPromptExecutionSettings(max_tokens=max_tokens, temperature=0.0, seed=0)
    kernel = Kernel()
    kernel.add_plugin(OrderPlugin(), plugin_name=PLUGIN)
    return ChatCompletionAgent(
        name="order_agent",
        instructions=SYSTEM,
        service=OpenAIChatCompletion(ai_model_id=model, async_client=client),
        kernel=kernel,
        function_choice_behavior=FunctionChoiceBehavior.Auto(maximum_auto_invoke_attempts=2),
        arguments=KernelArguments(settings=settings),
    )


async def converse(base_url: str, model: str, user_turns: list[str], max_tokens: int = 48) -> dict[str, Any]:
    """Run one conversation on one thread (two worked examples first), one agent call per user turn.

    Args:
        base_url: an OpenAI-compatible base URL ending in ``/v1``.
        model: the model name to ask for.
        user_turns: what the user says, in order.
        max_tokens: completion limit per model call, tokens.

    Returns:
        ``{"replies": [str, ...], "tool_calls": [{"name", "arguments", "result"}, ...]}``: the agent's
        answer per turn and every tool call it executed.
    """
    client = AsyncOpenAI(base_url=base_url, api_key="unused-on-loopback")
    agent = build_agent(client, model, max_tokens)
    thread = ChatHistoryAgentThread(ChatHistory(messages=worked_example("W0001") + worked_example("W0002")))
    calls: dict[str, dict[str, Any]] = {}

    async def on_intermediate(message: ChatMessageContent) -> None:
        for item in message.items:
            if isinstance(item, FunctionCallContent):
                arguments = item.arguments if isinstance(item.arguments, str) else json.dumps(item.arguments)
                calls[str(item.id)] = {"name": item.name, "arguments": arguments}
            elif isinstance(item, FunctionResultContent):
                calls.setdefault(str(item.id), {"name": item.name, "arguments": None})["result"] = str(
                    item.result
                )

    replies: list[str] = []
    try:
        for text in user_turns:
            reply = ""
            async for response in agent.invoke(text, thread=thread, on_intermediate_message=on_intermediate):
                reply, thread = str(response.content), response.thread
            replies.append(reply)
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
