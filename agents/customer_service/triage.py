"""The customer-service bot's triage step as a LangGraph graph: intent + order id, then a short reply.

The graph is ordinary LangGraph code over an OpenAI-compatible client; agentforge only points that
client at its gateway (``{gateway}/rollouts/{rollout_id}/v1``). The triage answer is the part the
trainer improves: reward = exact match of intent (and order id) against labelled data (Bitext).

Output format the model is asked for (one line each)::

    intent: <one of INTENTS>
    order_id: <digits or none>
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from agentforge.errors import MissingExtraError
from agentforge.rewards.triage import parse_triage

if TYPE_CHECKING:
    from openai import OpenAI

__all__ = ["INTENTS", "DEFAULT_TRIAGE_PROMPT", "TriageState", "parse_intent_and_order", "build_triage_graph"]

#: The 27 Bitext customer-support intents.
INTENTS: tuple[str, ...] = (
    "cancel_order", "change_order", "change_shipping_address", "check_cancellation_fee", "check_invoice",
    "check_payment_methods", "check_refund_policy", "complaint", "contact_customer_service",
    "contact_human_agent", "create_account", "delete_account", "delivery_options", "delivery_period",
    "edit_account", "get_invoice", "get_refund", "newsletter_subscription", "payment_issue", "place_order",
    "recover_password", "registration_problems", "review", "set_up_shipping_address", "switch_account",
    "track_order", "track_refund",
)  # fmt: skip

DEFAULT_TRIAGE_PROMPT = (
    "You route customer messages. Reply with two lines:\n"
    "intent: <one of: " + ", ".join(INTENTS) + ">\n"
    "order_id: <the order number in the message, or none>"
)

class TriageState(TypedDict, total=False):
    """Graph state. ``message`` is the input; the rest is filled by the nodes."""

    message: str
    triage_text: str
    intent: str | None
    order_id: str | None
    reply: str


def parse_intent_and_order(text: str) -> tuple[str | None, str | None]:
    """Parse the model's triage answer with the scorer's parser (:func:`agentforge.rewards.parse_triage`).

    Returns:
        ``(intent, order_id)``; ``intent`` is ``None`` unless it names one of :data:`INTENTS`.
    """
    pred = parse_triage(text, labels=INTENTS)
    if pred is None:
        return None, None
    return (pred.intent if pred.intent in INTENTS else None), pred.order_id


def build_triage_graph(
    client: OpenAI,
    model: str = "policy",
    system_prompt: str = DEFAULT_TRIAGE_PROMPT,
    max_tokens: int = 24,
    temperature: float = 0.0,
    reply: bool = True,
) -> Any:
    """Build the compiled triage graph ``START → triage → (reply) → END``.

    Args:
        client: an ``openai.OpenAI`` client (pointed at the gateway by the caller).
        model: model name to request; ``policy`` resolves to the active adapter version.
        system_prompt: the triage instructions (a versioned prompt resource in production).
        max_tokens: completion budget of the triage call, tokens.
        temperature: sampling temperature of the triage call (0 = greedy).
        reply: add a second LLM call that writes a one-sentence reply to the customer.

    Returns:
        A compiled LangGraph graph; ``graph.invoke({"message": str})`` returns a :class:`TriageState`.

    Raises:
        MissingExtraError: ``langgraph`` is not installed.
    """
    try:
        from langgraph.graph import END, START, StateGraph
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("langgraph", "agents", "the customer-service graph") from exc

    def triage(state: TriageState) -> TriageState:
        out = client.chat.completions.create(
            model=model,
            messages=[{"role": "system", "content": system_prompt}, {"role": "user", "content": state["message"]}],
            max_tokens=max_tokens,
            temperature=temperature,
        )
        text = out.choices[0].message.content or ""
        intent, order_id = parse_intent_and_order(text)
        return {"triage_text": text, "intent": intent, "order_id": order_id}

    def answer(state: TriageState) -> TriageState:
        topic = (state.get("intent") or "your request").replace("_", " ")
        out = client.chat.completions.create(
            model=model,
            messages=[
                {"role": "system", "content": f"You are a helpful support agent. The customer asks about {topic}."},
                {"role": "user", "content": state["message"]},
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
