"""The order desk: real Bitext customer messages about an order, three order tools over the τ-retail database,
and tasks whose gold tool, argument and fact are known before any rollout runs.

**Data.** Bitext has 473 messages whose entity span is an order number, under three intents
(``track_order`` 172, ``change_order`` 166, ``cancel_order`` 135). Their order numbers (``00123842``,
``732201349959``, ...) are not in any database, so each message gets a τ-retail order instead: the span is
replaced by the id of the order at position ``sha256("bitext/<row>") mod 1000`` in the sorted ``orders.json``
(``"need to cancel order 00004587345"`` → ``"need to cancel order #W2378156"``); the original number is kept
in ``metadata["bitext_order_number"]``. The message text is otherwise Bitext's, and every fact the tools
report (status, items) is the τ-retail order's. Train and held-out come from Bitext's fixed hash split
(:func:`~.datasets.load_bitext`, 10 % test: 426 train / 47 held-out messages).

**Tools** (:data:`ORDER_TOOLS`, one argument ``order_id`` each; :class:`OrderDesk` answers them on a rollout's
private :class:`~.tau_retail.RetailDB` view, deterministic, no LLM):

* ``get_order_status`` (gold for ``track_order``): ``{"order_id", "status"}``;
* ``cancel_order`` (``cancel_order``): a pending order is cancelled with τ-retail's own
  ``cancel_pending_order`` (reason ``"no longer needed"``) → ``{"order_id", "status": "cancelled"}``; any other
  → ``{"order_id", "status", "error": "only pending orders can be cancelled"}``;
* ``modify_order`` (``change_order``): ``{"order_id", "status", "items"}`` (item names) for a pending order,
  else ``{"order_id", "status", "error": "only pending orders can be modified"}``.

An unknown order id answers ``Error: order not found``. The **gold fact** of a task is the ``status`` the gold
call returns (what the bot must tell the customer); :data:`STATUSES` lists every status the data has.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from agentforge.agents.customer_service.datasets import load_bitext
from agentforge.agents.customer_service.rewards.triage import normalize_entity
from agentforge.agents.customer_service.tau_retail.write_tools import cancel_pending_order
from agentforge.errors import UserError
from agentforge.types import Task

if TYPE_CHECKING:
    from agentforge.agents.customer_service.tau_retail import RetailDB, TauRetail

__all__ = [
    "DATASET",
    "INTENT_TOOL",
    "ORDER_TOOLS",
    "STATUSES",
    "OrderDesk",
    "order_desk_tasks",
    "order_for_row",
    "round_robin",
    "row_choice",
]

T = TypeVar("T")

#: ``metadata["dataset"]`` of every order-desk task.
DATASET = "order_desk"
#: The gold tool of each Bitext intent that names an order.
INTENT_TOOL: dict[str, str] = {
    "track_order": "get_order_status",
    "cancel_order": "cancel_order",
    "change_order": "modify_order",
}
#: Every order status in τ-retail v1 (the values a reply may state).
STATUSES: tuple[str, ...] = ("pending", "processed", "delivered", "cancelled")
#: τ-retail's cancel reason used by ``cancel_order`` (one of its two allowed reasons).
CANCEL_REASON = "no longer needed"


def _tool(name: str, description: str) -> dict[str, Any]:
    parameters = {
        "type": "object",
        "properties": {"order_id": {"type": "string", "description": "the order id, like #W1234567"}},
        "required": ["order_id"],
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


#: The three OpenAI function schemas the bot is offered (in this order).
ORDER_TOOLS: tuple[dict[str, Any], ...] = (
    _tool("get_order_status", "Look up the status of an order."),
    _tool("cancel_order", "Cancel an order."),
    _tool("modify_order", "Start changing the items of an order."),
)


class OrderDesk:
    """The deterministic backend of the three order tools on one rollout's τ-retail database view.

    Not thread-safe: one desk (and view) per rollout; writes (a cancellation) stay in that view.

    Args:
        db: the rollout's private view (``load_tau_retail().new_db()``).
    """

    def __init__(self, db: RetailDB) -> None:
        self.db = db

    def call(self, name: str, arguments: Mapping[str, Any] | None) -> str:
        """Run one tool and return its output (JSON, or ``"Error: ..."``; never raises for a bad call).

        Args:
            name: one of the :data:`ORDER_TOOLS` names.
            arguments: the parsed arguments (``{"order_id": "#W1234567"}``); the id is matched after
                :func:`~.rewards.triage.normalize_entity` (so ``W1234567`` and ``#w1234567`` find it).

        Returns:
            The tool output the model sees.
        """
        if name not in INTENT_TOOL.values():
            return f"Error: unknown tool {name!r}"
        if not isinstance(arguments, Mapping) or set(arguments) != {"order_id"}:
            return "Error: the tool takes exactly one argument, order_id"
        key = normalize_entity(arguments["order_id"])
        order_id = f"#{key}" if key else ""
        order = self.db.get("orders", order_id)
        if order is None:
            return "Error: order not found"
        status = order["status"]
        if name == "get_order_status":
            return json.dumps({"order_id": order_id, "status": status})
        if status != "pending":
            verb = "cancelled" if name == "cancel_order" else "modified"
            return json.dumps(
                {"order_id": order_id, "status": status, "error": f"only pending orders can be {verb}"}
            )
        if name == "cancel_order":
            out = cancel_pending_order(self.db, order_id, CANCEL_REASON)
            return json.dumps({"order_id": order_id, "status": json.loads(out)["status"]})
        return json.dumps(
            {"order_id": order_id, "status": status, "items": [i["name"] for i in order["items"]]}
        )


def row_choice(env: TauRetail, table: str, label: str) -> str:
    """A deterministic pick for a Bitext row: the id at ``sha256(label)`` among the table's sorted ids.

    Args:
        env: the loaded τ-retail environment.
        table: ``"orders"`` or ``"users"``.
        label: what is hashed, e.g. ``"bitext/<row>"``.

    Returns:
        One id of ``table``.
    """
    ids = sorted(key for key, _ in env.data.items(table))
    digest = hashlib.sha256(label.encode()).digest()
    return ids[int.from_bytes(digest[:8], "big") % len(ids)]


def order_for_row(env: TauRetail, row: int) -> str:
    """The τ-retail order id a Bitext row is given: sorted ``orders.json`` ids at ``sha256("bitext/<row>")``.

    Args:
        env: the loaded τ-retail environment.
        row: the Bitext row number (``metadata["index"]``).

    Returns:
        An order id like ``"#W2378156"``.
    """
    return row_choice(env, "orders", f"bitext/{row}")


def round_robin(queues: Sequence[Sequence[T]]) -> list[T]:
    """One item of each queue in turn; a queue that runs out drops away: ``[[a1, a2], [b1]]`` → ``[a1, b1, a2]``."""
    return [q[k] for k in range(max(map(len, queues), default=0)) for q in queues if k < len(q)]


def _task(source: Task, env: TauRetail, temperature: float) -> Task:
    meta = source.metadata
    text, number = source.input["text"], meta["order_id"]
    start = text.find(number)
    if start < 0:  # pragma: no cover - load_bitext takes the entity from the text itself
        raise UserError(f"Bitext row {meta['index']}: order number {number!r} not in its message")
    order_id = order_for_row(env, meta["index"])
    tool = INTENT_TOOL[meta["intent"]]
    output = json.loads(OrderDesk(env.new_db()).call(tool, {"order_id": order_id}))
    return Task(
        task_id=f"{DATASET}/bitext-{meta['index']}",
        input={"text": text[:start] + order_id + text[start + len(number) :], "temperature": temperature},
        metadata={
            "dataset": DATASET,
            "split": meta["split"],
            "index": meta["index"],
            "intent": meta["intent"],
            "order_id": order_id,
            "bitext_order_number": number,
            "gold_tool": tool,
            "gold_arguments": {"order_id": order_id},
            "gold_fact": output["status"],
            "fact_alternatives": [s for s in STATUSES if s != output["status"]],
        },
    )


def order_desk_tasks(
    train_size: int | None = None,
    eval_size: int | None = None,
    *,
    train_temperature: float = 1.0,
    data_dir: str | None = None,
    tau_data_dir: str | None = None,
) -> tuple[list[Task], list[Task]]:
    """The order-desk tasks: Bitext's order-number messages with a τ-retail order each (module docstring).

    Deterministic and offline: the same data gives the same tasks in the same order: round-robin over the
    intents (``track_order``, ``cancel_order``, ``change_order``; Bitext row order within each), so every prefix
    (``eval_size=30``) holds the three gold tools in nearly equal shares.

    Args:
        train_size: the first ``train_size`` training tasks (``None``: all 431).
        eval_size: the first ``eval_size`` held-out tasks (``None``: all 42).
        train_temperature: ``input["temperature"]`` of the training tasks (held-out tasks are greedy, 0.0).
        data_dir: the ``bitext_customer_support`` folder (default: the shared data folder).
        tau_data_dir: the ``tau_retail/v1`` folder (default: the shared data folder).

    Returns:
        ``(train, held_out)``, disjoint by Bitext's split; each task has ``input = {"text", "temperature"}``
        and ``metadata = {"gold_tool", "gold_arguments", "gold_fact", "fact_alternatives"`` (the other
        :data:`STATUSES`), ``"intent", "order_id",
        "bitext_order_number", "dataset", "split", "index"}``.

    Raises:
        UserError: the data is missing, or a size is negative or larger than the split.
    """
    from agentforge.agents.customer_service.tau_retail import load_tau_retail

    env = load_tau_retail(tau_data_dir)
    rows = [
        t
        for t in load_bitext("all", data_dir)
        if t.metadata["intent"] in INTENT_TOOL and t.metadata["order_id"]
    ]
    out = []
    for split, size, temperature in (("train", train_size, train_temperature), ("test", eval_size, 0.0)):
        by_intent = [
            [t for t in rows if t.metadata["split"] == split and t.metadata["intent"] == i]
            for i in INTENT_TOOL
        ]
        tasks = [_task(t, env, temperature) for t in round_robin(by_intent)]
        if size is not None and not 0 <= size <= len(tasks):
            raise UserError(f"order_desk_tasks: {split} size must be in [0, {len(tasks)}], got {size}")
        out.append(tasks[:size])
    return out[0], out[1]
