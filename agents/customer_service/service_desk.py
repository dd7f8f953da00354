"""The service desk: a customer-service job with headroom — eight tools over orders, invoices and accounts,
policy questions answered from a knowledge base with no tool, and turns that need two calls.

The order desk (:mod:`.order_desk`, three tools) is learnt in one round of supervised fine-tuning; this desk is
built so that one round is not the end (issue "learning that compounds"): more tools, confusable pairs, a choice
between calling a tool and answering from the knowledge base, and two-call turns.

**Data.** Real Bitext customer messages (:func:`~.datasets.load_bitext`), every fact from the τ-retail database:

===================  ==========================  =====================  ===================================
Bitext intent        message names               gold call              fact the reply must state
===================  ==========================  =====================  ===================================
``track_order``      an order id                 ``get_order_status``   the order's status
``cancel_order``     an order id                 ``cancel_order``       ``cancelled`` (or the status)
``change_order``     an order id                 ``modify_order``       the order's status
``check_invoice``    an invoice id               ``get_invoice``        the amount charged (``536.65``)
``get_invoice``      an invoice id               ``send_invoice``       the e-mail the copy went to
``edit_account``     an account type             ``edit_account``       the request's reference
``delete_account``   an account type             ``close_account``      the request's reference
``switch_account``   an account type             ``switch_account``     the request's reference
``check_refund_policy``  —                       none (knowledge base)  ``5 to 7 business days``
``check_payment_methods`` —                      none (knowledge base)  ``paypal``
two of the above     an order id + another id    both calls             both facts
===================  ==========================  =====================  ===================================

Confusable pairs: ``get_invoice`` / ``send_invoice`` (Bitext's "check" and "get" an invoice), the three
account tools, and the three order tools. A Bitext id is replaced by a τ-retail one chosen by a hash of the row
(as :func:`~.order_desk.order_for_row` does for orders): an invoice id is ``INV`` + the digits of an order
(``#W2611340`` → ``INV2611340``; the invoice is that order's first payment); an account message belongs to the
τ-retail user at ``sha256("bitext-user/<row>")``, the signed-in customer. An account request's reference is
``R`` + six digits of ``sha256("<tool>/<user>/<account type>")``: a different tool gives a different reference.

**Splits.** Bitext's hash split (10 % test). Tasks are ordered round-robin over the eleven kinds above, so any
prefix holds every kind in nearly equal shares (2 of 11 need no tool, 1 of 11 two calls).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentforge.agents.customer_service.datasets import load_bitext
from agentforge.agents.customer_service.order_desk import (
    INTENT_TOOL,
    STATUSES,
    OrderDesk,
    order_for_row,
    round_robin,
    row_choice,
)
from agentforge.agents.customer_service.rewards.triage import normalize_entity
from agentforge.errors import UserError
from agentforge.types import Task

if TYPE_CHECKING:
    from agentforge.agents.customer_service.tau_retail import RetailDB, TauRetail

__all__ = [
    "DATASET",
    "KNOWLEDGE_BASE",
    "POLICY_FACTS",
    "SERVICE_TOOLS",
    "ServiceDesk",
    "invoice_for_order",
    "service_desk_tasks",
]

#: ``metadata["dataset"]`` of every service-desk task.
DATASET = "service_desk"
#: The shop's policies the bot answers from (the system prompt carries them); from τ-retail's ``wiki.md``.
KNOWLEDGE_BASE = (
    "Refunds go back to the original payment method: at once for a gift card, otherwise in 5 to 7 business "
    "days. We accept gift cards, PayPal and credit cards. Only pending orders can be cancelled or changed."
)
#: Bitext intents answered from :data:`KNOWLEDGE_BASE` with no tool, and the fact the reply must state.
POLICY_FACTS: dict[str, str] = {
    "check_refund_policy": "5 to 7 business days",
    "check_payment_methods": "paypal",
}
#: Bitext intents that name an invoice or an account type, and their gold tool.
ENTITY_TOOL: dict[str, tuple[str, str]] = {
    "check_invoice": ("invoice_id", "get_invoice"),
    "get_invoice": ("invoice_id", "send_invoice"),
    "edit_account": ("account_type", "edit_account"),
    "delete_account": ("account_type", "close_account"),
    "switch_account": ("account_type", "switch_account"),
}
_ACCOUNT_TOOLS = ("edit_account", "close_account", "switch_account")
#: The answer field a reply must state, per tool (the order tools: ``status``).
_FACT_FIELD = {
    "get_invoice": "amount",
    "send_invoice": "sent_to",
    **dict.fromkeys(_ACCOUNT_TOOLS, "reference"),
}
#: The second half of a two-call turn is joined to the first with this.
JOIN = ". Also, "


def _tool(name: str, description: str, argument: str, about: str) -> dict[str, Any]:
    parameters = {
        "type": "object",
        "properties": {argument: {"type": "string", "description": about}},
        "required": [argument],
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


_ORDER = ("order_id", "the order id, like #W1234567")
_INVOICE = ("invoice_id", "the invoice id, like INV1234567")
_ACCOUNT = ("account_type", "the account type the customer names, like gold")
#: The eight OpenAI function schemas the bot is offered (in this order).
SERVICE_TOOLS: tuple[dict[str, Any], ...] = (
    _tool("get_order_status", "Look up the status of an order.", *_ORDER),
    _tool("cancel_order", "Cancel an order.", *_ORDER),
    _tool("modify_order", "Start changing the items of an order.", *_ORDER),
    _tool("get_invoice", "Look up the amount charged on an invoice.", *_INVOICE),
    _tool("send_invoice", "E-mail the customer a copy of an invoice.", *_INVOICE),
    _tool("edit_account", "Start editing the details of the customer's account.", *_ACCOUNT),
    _tool("close_account", "Close the customer's account.", *_ACCOUNT),
    _tool("switch_account", "Switch the customer to another account type.", *_ACCOUNT),
)
_ARGUMENT = {
    t["function"]["name"]: next(iter(t["function"]["parameters"]["properties"])) for t in SERVICE_TOOLS
}


def invoice_for_order(order_id: str) -> str:
    """The invoice id of an order's first payment: ``"#W2611340"`` → ``"INV2611340"``."""
    return "INV" + order_id.lstrip("#").lstrip("W")


def reference(tool: str, user_id: str, account_type: str) -> str:
    """An account request's reference: ``R`` + six digits of ``sha256("<tool>/<user>/<ACCOUNT TYPE>")``."""
    digest = hashlib.sha256(f"{tool}/{user_id}/{account_type.upper()}".encode()).digest()
    return f"R{int.from_bytes(digest[:8], 'big') % 1_000_000:06d}"


class ServiceDesk:
    """The deterministic backend of the eight :data:`SERVICE_TOOLS` on one rollout's τ-retail database view.

    Not thread-safe: one desk (and view) per rollout; writes (a cancellation) stay in that view.

    Args:
        db: the rollout's private view (``load_tau_retail().new_db()``).
        user_id: the signed-in customer (account tools act on this user; ``None``: they answer an error).
    """

    def __init__(self, db: RetailDB, user_id: str | None = None) -> None:
        self.db, self.user_id = db, user_id
        self.orders = OrderDesk(db)

    def call(self, name: str, arguments: Mapping[str, Any] | None) -> str:
        """Run one tool and return its output (JSON, or ``"Error: ..."``; never raises for a bad call).

        Args:
            name: one of the :data:`SERVICE_TOOLS` names.
            arguments: the parsed arguments, exactly the tool's one argument; ids are matched after
                :func:`~.rewards.triage.normalize_entity`.

        Returns:
            The tool output the model sees: orders as :class:`~.order_desk.OrderDesk`;
            ``get_invoice`` → ``{"invoice_id", "order_id", "amount", "status"}``; ``send_invoice`` →
            ``{"invoice_id", "sent_to"}``; account tools → ``{"account_type", "request", "reference",
            "confirmation_sent_to"}``.
        """
        if name in INTENT_TOOL.values():
            return self.orders.call(name, arguments)
        if name not in _ARGUMENT:
            return f"Error: unknown tool {name!r}"
        argument = _ARGUMENT[name]
        if not isinstance(arguments, Mapping) or set(arguments) != {argument}:
            return f"Error: the tool takes exactly one argument, {argument}"
        key = normalize_entity(arguments[argument]) or ""
        if argument == "invoice_id":
            order = (
                self.db.get("orders", f"#W{key[3:]}") if key.startswith("INV") and key[3:].isdigit() else None
            )
            if order is None:
                return "Error: invoice not found"
            invoice = invoice_for_order(order["order_id"])
            if name == "send_invoice":
                user = self.db.get("users", order["user_id"]) or {}
                return json.dumps({"invoice_id": invoice, "sent_to": user.get("email", "")})
            payment = order["payment_history"][0]
            return json.dumps(
                {
                    "invoice_id": invoice,
                    "order_id": order["order_id"],
                    "amount": f"{payment['amount']:.2f}",
                    "status": "paid",
                }
            )
        user = self.db.get("users", self.user_id) if self.user_id else None
        if user is None or not key:
            return "Error: no signed-in customer" if user is None else "Error: name the account type"
        request = {"edit_account": "edit", "close_account": "close", "switch_account": "switch"}[name]
        return json.dumps(
            {
                "account_type": key.lower(),
                "request": request,
                "reference": reference(name, str(self.user_id), key),
                "confirmation_sent_to": user["email"],
            }
        )


def _part(source: Task, env: TauRetail) -> dict[str, Any]:
    """One Bitext message as a desk request: its text with the id replaced, the gold call, the user."""
    meta, text = source.metadata, source.input["text"]
    intent, row = meta["intent"], meta["index"]
    if intent in POLICY_FACTS:
        return {"text": text, "calls": [], "user_id": None, "entity": None}
    if intent in INTENT_TOOL:
        old, new, tool, user = meta["order_id"], order_for_row(env, row), INTENT_TOOL[intent], None
    else:
        _, tool = ENTITY_TOOL[intent]
        old = meta["entity"]
        if tool in _ACCOUNT_TOOLS:
            new, user = old, row_choice(env, "users", f"bitext-user/{row}")
        else:
            new, user = invoice_for_order(order_for_row(env, row)), None
    start = text.find(old)
    if start < 0:  # pragma: no cover - load_bitext takes the entity from the text itself
        raise UserError(f"Bitext row {row}: entity {old!r} not in its message")
    argument = _ARGUMENT[tool]
    value = str(normalize_entity(new)).lower() if argument == "account_type" else new
    return {
        "text": text[:start] + new + text[start + len(old) :],
        "user_id": user,
        "entity": old,
        "calls": [{"name": tool, "arguments": {argument: value}}],
    }


def _facts(parts: list[dict[str, Any]], intents: list[str], env: TauRetail) -> list[str]:
    """The facts the reply must state: each gold call's, run in order on one fresh view."""
    facts = []
    db = env.new_db()
    for part, intent in zip(parts, intents, strict=True):
        if not part["calls"]:
            facts.append(POLICY_FACTS[intent])
            continue
        call = part["calls"][0]
        out = json.loads(ServiceDesk(db, part["user_id"]).call(call["name"], call["arguments"]))
        facts.append(out[_FACT_FIELD.get(call["name"], "status")])
    return facts


def _task(sources: list[Task], env: TauRetail, temperature: float) -> Task:
    parts = [_part(s, env) for s in sources]
    intents = [s.metadata["intent"] for s in sources]
    facts = _facts(parts, intents, env)
    calls = [c for p in parts for c in p["calls"]]
    text = JOIN.join(
        p["text"].rstrip(" ?.!") if i < len(parts) - 1 else p["text"] for i, p in enumerate(parts)
    )
    statuses = [f for f in facts if f in STATUSES]
    meta = sources[0].metadata
    return Task(
        task_id=f"{DATASET}/bitext-" + "+".join(str(s.metadata["index"]) for s in sources),
        input={"text": text, "temperature": temperature},
        metadata={
            "dataset": DATASET,
            "split": meta["split"],
            "index": meta["index"],
            "intent": "+".join(intents),
            "kind": "two_calls" if len(sources) > 1 else intents[0],
            "user_id": next((p["user_id"] for p in parts if p["user_id"]), None),
            "gold_calls": calls,
            "gold_facts": facts,
            "gold_tool": calls[0]["name"] if calls else "(none)",
            "fact_alternatives": [s for s in STATUSES if s not in statuses] if len(statuses) == 1 else [],
            "bitext_entities": [p["entity"] for p in parts],
        },
    )


def service_desk_tasks(
    train_size: int | None = None,
    eval_size: int | None = None,
    *,
    train_temperature: float = 1.0,
    data_dir: str | None = None,
    tau_data_dir: str | None = None,
) -> tuple[list[Task], list[Task]]:
    """The service-desk tasks (module docstring): Bitext messages with τ-retail ids, facts and gold calls.

    Deterministic and offline: the same data gives the same tasks in the same order, round-robin over the eleven
    kinds (ten intents, then two-call turns; Bitext row order within each). A two-call turn joins an order
    message to an invoice or account message of the same split (``"<first>. Also, <second>"``), as many as
    a single kind has on average; its gold calls are both, in that order, and its facts both.

    Args:
        train_size: the first ``train_size`` training tasks (``None``: all).
        eval_size: the first ``eval_size`` held-out tasks (``None``: all of Bitext's test split).
        train_temperature: ``input["temperature"]`` of the training tasks (held-out tasks are greedy, 0.0).
        data_dir: the ``bitext_customer_support`` folder (default: the shared data folder).
        tau_data_dir: the ``tau_retail/v1`` folder (default: the shared data folder).

    Returns:
        ``(train, held_out)``, disjoint by Bitext's split; ``input = {"text", "temperature"}`` and
        ``metadata = {"gold_calls": [{"name", "arguments"}] (0-2), "gold_facts": [str], "gold_tool"`` (the first
        call's name, ``"(none)"`` for none), ``"fact_alternatives", "kind", "intent", "user_id", "dataset",
        "split", "index", "bitext_entities"}``.

    Raises:
        UserError: the data is missing, or a size is negative or larger than the split.
    """
    from agentforge.agents.customer_service.tau_retail import load_tau_retail

    env = load_tau_retail(tau_data_dir)
    intents = [*INTENT_TOOL, *ENTITY_TOOL, *POLICY_FACTS]
    rows = [
        t
        for t in load_bitext("all", data_dir)
        if t.metadata["intent"] in POLICY_FACTS
        or (t.metadata["intent"] in INTENT_TOOL and t.metadata["order_id"])
        or t.metadata["entity_type"] == ENTITY_TOOL.get(t.metadata["intent"], ("",))[0]
    ]
    out = []
    for split, size, temperature in (("train", train_size, train_temperature), ("test", eval_size, 0.0)):
        kinds = [
            [[t] for t in rows if t.metadata["split"] == split and t.metadata["intent"] == i] for i in intents
        ]
        firsts = [t for t in rows if t.metadata["split"] == split and t.metadata["intent"] in INTENT_TOOL]
        seconds = [t for t in rows if t.metadata["split"] == split and t.metadata["intent"] in ENTITY_TOOL]
        firsts.sort(key=lambda t: hashlib.sha256(f"pair/{t.metadata['index']}".encode()).digest())
        pairs = [[a, b] for a, b in zip(firsts, seconds[::-1], strict=False)]
        kinds.append(pairs[: sum(map(len, kinds)) // len(kinds)])  # as many as a single kind on average
        ordered = round_robin(kinds)
        if size is not None and not 0 <= size <= len(ordered):
            raise UserError(f"service_desk_tasks: {split} size must be in [0, {len(ordered)}], got {size}")
        out.append([_task(s, env, temperature) for s in ordered[:size]])
    return out[0], out[1]
