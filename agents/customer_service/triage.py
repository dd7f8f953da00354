"""The customer-service bot's triage step as a LangGraph graph: route a message to a label, then reply.

The graph is ordinary LangGraph code over an OpenAI-compatible client; agentforge only points that
client at its gateway (``{gateway}/rollouts/{rollout_id}/v1``). The triage answer is the part the trainer
improves: reward = exact match of the label against labelled data (Bitext categories or intents).

The model's answer is started for it (an assistant *prefill* such as ``"Category:"``, sent with vLLM's
``continue_final_message``), so the 135M default model answers in the label vocabulary often enough for
GRPO to have a non-zero starting success rate; the completion is the label it samples after the prefill.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from agentforge.agents.customer_service.rewards.triage import normalize_intent
from agentforge.errors import MissingExtraError

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types.chat import ChatCompletionMessageParam

    from agentforge.runtime.context import RolloutContext
    from agentforge.types import Task

__all__ = [
    "TRIAGE_PROMPT_NAME",
    "CATEGORIES",
    "INTENTS",
    "triage_prompt",
    "TriageState",
    "parse_label",
    "build_triage_graph",
    "triage_agent",
]

#: Name of the triage step's versioned system-prompt resource (read by :func:`triage_agent`).
TRIAGE_PROMPT_NAME = "prompt:triage"

#: The 11 Bitext customer-support categories (the main job's triage labels).
CATEGORIES: tuple[str, ...] = (
    "account",
    "cancellation_fee",
    "contact",
    "delivery",
    "feedback",
    "invoice",
    "newsletter",
    "order",
    "payment",
    "refund",
    "shipping_address",
)

#: The 27 Bitext customer-support intents (a harder configuration of the same graph).
INTENTS: tuple[str, ...] = (
    "cancel_order",
    "change_order",
    "change_shipping_address",
    "check_cancellation_fee",
    "check_invoice",
    "check_payment_methods",
    "check_refund_policy",
    "complaint",
    "contact_customer_service",
    "contact_human_agent",
    "create_account",
    "delete_account",
    "delivery_options",
    "delivery_period",
    "edit_account",
    "get_invoice",
    "get_refund",
    "newsletter_subscription",
    "payment_issue",
    "place_order",
    "recover_password",
    "registration_problems",
    "review",
    "set_up_shipping_address",
    "switch_account",
    "track_order",
    "track_refund",
)

_WORD = re.compile(r"[A-Za-z_][A-Za-z_ -]*")


def triage_prompt(labels: Sequence[str] = CATEGORIES, kind: str = "category") -> str:
    """The system prompt listing the labels (kept short: prompt length drives CPU training cost)."""
    return (
        f"{kind.capitalize()} options: {', '.join(labels)}.\nReply with the {kind} of the customer's message."
    )


class TriageState(TypedDict, total=False):
    """Graph state. ``message`` is the input; the nodes fill the rest."""

    message: str
    triage_text: str
    label: str | None
    reply: str


def _message(state: TriageState) -> str:
    """``state["message"]``, the graph's input (``KeyError`` without it)."""
    if "message" not in state:
        raise KeyError("message")
    return state["message"]


def parse_label(text: str, labels: Sequence[str] = CATEGORIES) -> str | None:
    """The label a completion names: its first word(s), normalised, if that is one of ``labels``.

    ``" Account."`` → ``"account"``; ``" shipping address"`` → ``"shipping_address"``; anything else → ``None``.
    """
    match = _WORD.search(text or "")
    if match is None:
        return None
    words = match.group(0).split()
    for n in (3, 2, 1):  # longest label first: "shipping address" before "shipping"
        candidate = normalize_intent(" ".join(words[:n]))
        if candidate in labels:
            return candidate
    return None


def build_triage_graph(
    client: OpenAI,
    model: str = "policy",
    labels: Sequence[str] = CATEGORIES,
    system_prompt: str | None = None,
    prefill: str = "Category:",
    max_tokens: int = 4,
    temperature: float = 0.0,
    reply: bool = False,
    choose: bool = False,
) -> Any:
    """Build the compiled graph ``START → triage → (reply) → END``.

    Args:
        client: an ``openai.OpenAI`` client (the caller points it at the gateway).
        model: model name to request; ``policy`` resolves to the active (or the rollout's pinned) version.
        labels: the label vocabulary.
        system_prompt: instructions (``None``: :func:`triage_prompt` of ``labels``; ``""`` sends an empty
            system message).
        prefill: the start of the assistant's answer; empty for none.
        max_tokens: completion budget of the triage call, tokens.
        temperature: sampling temperature of the triage call (0 = greedy).
        reply: add a second LLM call that writes a one-sentence reply to the customer.
        choose: let the engine sample only one of ``labels`` (vLLM structured outputs, ``{"choice": [...]}``,
            each label after a space, following ``prefill``): every answer is a label, so a GRPO group compares
            labels instead of mostly unparsable text. The gateway records the policy's own (unconstrained)
            log-probs of such a call for training (:mod:`agentforge.gateway.guided`). vLLM only: the embedded
            backend and hosted APIs do not take ``structured_outputs``.

    Returns:
        A compiled LangGraph graph; ``graph.invoke({"message": str})`` returns a :class:`TriageState`.

    Raises:
        MissingExtraError: ``langgraph`` is not installed.
    """
    try:
        from langgraph.graph import END, START, StateGraph
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("langgraph", "agents", "the customer-service graph") from exc
    instructions = triage_prompt(labels) if system_prompt is None else system_prompt

    def triage(state: TriageState) -> TriageState:
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": instructions},
            {"role": "user", "content": _message(state)},
        ]
        extra: dict[str, Any] = {}
        if prefill:
            messages.append({"role": "assistant", "content": prefill})
            extra = {"continue_final_message": True, "add_generation_prompt": False}
        if choose:
            extra["structured_outputs"] = {"choice": [f" {label}" for label in labels]}
        out = client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=temperature, extra_body=extra
        )
        text = out.choices[0].message.content or ""
        return {"triage_text": text, "label": parse_label(text, labels)}

    def answer(state: TriageState) -> TriageState:
        topic = (state.get("label") or "your request").replace("_", " ")
        out = client.chat.completions.create(
            model=model,
            messages=[
                {
                    "role": "system",
                    "content": f"You are a helpful support agent. The customer asks about {topic}.",
                },
                {"role": "user", "content": _message(state)},
            ],
            max_tokens=32,
            temperature=0.0,
        )
        return {"reply": out.choices[0].message.content or ""}

    graph = StateGraph(TriageState)
    graph.add_node("triage", triage)
    graph.add_edge(START, "triage")
    if reply:
        graph.add_node("answer", answer)
        graph.add_edge("triage", "answer")
        graph.add_edge("answer", END)
    else:
        graph.add_edge("triage", END)
    return graph.compile()


def triage_agent(task: Task, ctx: RolloutContext) -> float:
    """Runner agent: run the triage graph on ``task.input["text"]`` and score it against the gold label.

    Task fields: ``input["text"]`` (the customer message), ``input.get("temperature", 1.0)``,
    ``metadata["label"]`` (the gold label; ``metadata["category"]`` is used when absent).

    The system prompt is the versioned resource :data:`TRIAGE_PROMPT_NAME` read at the start of the
    rollout (``ctx.prompt``: the rollout's pinned version, else the active one, version 1 being
    :func:`triage_prompt` of :data:`CATEGORIES`); the version used is recorded on the rollout.

    Returns:
        The reward: 1.0 when the predicted label equals the gold one, else 0.0.
    """
    system_prompt = ctx.prompt(TRIAGE_PROMPT_NAME, default=triage_prompt(CATEGORIES))
    graph = build_triage_graph(
        ctx.openai_client(max_retries=0),
        system_prompt=system_prompt,
        temperature=float(task.input.get("temperature", 1.0)),
    )
    state = graph.invoke({"message": task.input["text"]})
    gold = normalize_intent(str(task.metadata.get("label") or task.metadata.get("category") or ""))
    return 1.0 if state.get("label") == gold else 0.0
