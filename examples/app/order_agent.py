"""The order bot (``agents/customer_service/order_bot.py``) as the app's agent, one customer turn at a time.

The same interface as :mod:`chat_agent`, so ``service.create_app(..., agent=order_agent,
prompt_name=order_agent.PROMPT_NAME)`` serves the order bot: the customer's message → a tool call through the
gateway (forced, ``tool_choice="required"``) → the deterministic order desk answers from the τ-retail database →
the reply. Each turn runs the LangGraph graph in a worker thread with a synchronous client on the conversation's
gateway URL, so both calls are recorded on the conversation's rollout, token in / token out. Each turn gets a
fresh desk (a private view of the τ-retail database): a cancellation is not seen by a later turn or conversation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import openai

from agentforge.agents.customer_service.order_bot import (
    DEFAULT_ORDER_PROMPT,
    ORDER_PROMPT_NAME,
    build_order_bot_graph,
)
from agentforge.agents.customer_service.order_desk import OrderDesk

__all__ = ["PROMPT_NAME", "SYSTEM", "new_conversation", "reply", "stream_reply"]

#: The order bot's versioned system prompt and its version 1.
PROMPT_NAME, SYSTEM = ORDER_PROMPT_NAME, DEFAULT_ORDER_PROMPT


def new_conversation(system: str = SYSTEM) -> list[dict[str, Any]]:
    """A fresh message list holding only the system prompt (the graph adds its worked example itself)."""
    return [{"role": "system", "content": system}]


def _turn(
    base_url: str, api_key: str, model: str, messages: list[dict[str, Any]], max_tokens: int
) -> tuple[str, list[dict[str, Any]]]:
    from agentforge.agents.customer_service.tau_retail import load_tau_retail

    desk = OrderDesk(load_tau_retail().new_db())
    tools: list[dict[str, Any]] = []
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        graph = build_order_bot_graph(
            client,
            desk=desk,
            system_prompt=str(messages[0]["content"]),
            model=model,
            act_max_tokens=max_tokens,
            on_tool_call=lambda call, output: tools.append(
                {"name": call.name, "arguments": call.arguments, "result": output}
            ),
        )
        state = graph.invoke({"messages": messages[1:], "llm_calls": 0})
    new = state["messages"][len(messages) - 1 :]
    messages.extend(new)
    last = new[-1] if new else {}
    text = str(last.get("content") or "") if last.get("role") == "assistant" else ""
    return text, tools


async def reply(
    client: openai.AsyncOpenAI, model: str, messages: list[dict[str, Any]], max_tokens: int = 48
) -> tuple[str, list[dict[str, Any]]]:
    """Answer the last customer message with one order-bot turn (greedy).

    Args:
        client: the app's client for this conversation (its ``base_url`` is the rollout's gateway URL).
        model: the model name (the gateway alias, e.g. ``policy``).
        messages: the system prompt, earlier turns and the customer's message; extended in place.
        max_tokens: completion budget of the tool call, tokens.

    Returns:
        ``(reply, tool_calls)``: the reply text and ``[{"name", "arguments", "result"}]``.

    Raises:
        openai.APIError: a model call failed.
    """
    base_url, key = str(client.base_url), client.api_key
    return await asyncio.to_thread(_turn, base_url, key, model, messages, max_tokens)


async def stream_reply(
    client: openai.AsyncOpenAI, model: str, messages: list[dict[str, Any]], max_tokens: int = 48
) -> AsyncIterator[dict[str, Any]]:
    """:func:`reply` as :mod:`chat_agent`'s events (one ``tool`` per call, then ``done``; no text deltas).

    Raises:
        openai.APIError: a model call failed.
    """
    text, tools = await reply(client, model, messages, max_tokens)
    for tool in tools:
        yield {"type": "tool", **tool}
    yield {"type": "done", "reply": text, "tool_calls": tools}
