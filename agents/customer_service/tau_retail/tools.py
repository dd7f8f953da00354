"""The 16 τ-retail tools, written from the policy (``wiki.md``) and the schemas (``tools.json``).

Each tool takes a :class:`~.db.RetailDB` view and its keyword arguments and returns the string τ-bench
returns: the JSON of the record (``json.dumps(record)``) for lookups and writes, a bare user id for the
user look-ups, and ``"Error: ..."`` for every agent mistake (unknown id, wrong order status, bad
argument). Write tools mutate only the rollout's own view; read tools never write. The write tools live in
:mod:`.write_tools`. Output formats and database mutations were matched against the real tool outputs in ``few_shot_trajectories.jsonl`` and
are pinned by replaying every gold task (``tests/test_tau_retail.py``).

``tools.json`` next to this module is a byte-identical copy of the upstream schemas (τ-bench,
MIT (c) 2024 Sierra, see ``LICENSE_tau-bench.txt``).
"""

from __future__ import annotations

import ast
import copy
import functools
import json
import operator
from collections.abc import Callable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

from agentforge.agents.customer_service.tau_retail.write_tools import (
    cancel_pending_order,
    exchange_delivered_order_items,
    modify_pending_order_address,
    modify_pending_order_items,
    modify_pending_order_payment,
    modify_user_address,
    return_delivered_order_items,
)

if TYPE_CHECKING:
    from agentforge.agents.customer_service.tau_retail.db import RetailDB

__all__ = ["TOOLS", "READ_TOOLS", "WRITE_TOOLS", "call_tool", "tool_schemas", "calculate_expression"]

Tool = Callable[..., str]


@functools.cache
def _schemas() -> tuple[dict[str, Any], ...]:
    assert __package__ is not None  # a module of the tau_retail package
    text = resources.files(__package__).joinpath("tools.json").read_text(encoding="utf-8")
    return tuple(json.loads(text))


def tool_schemas() -> list[dict[str, Any]]:
    """Return the OpenAI function schemas of the 16 tools (a fresh deep copy; safe to edit).

    Returns:
        ``[{"type": "function", "function": {"name", "description", "parameters"}}, ...]`` in the
        upstream order.
    """
    return copy.deepcopy(list(_schemas()))


def _order(db: RetailDB, order_id: str) -> dict[str, Any] | None:
    return db.get("orders", order_id)


def _dump(record: Any) -> str:
    return json.dumps(record)


# -- read tools -------------------------------------------------------------------------------------


def find_user_id_by_email(db: RetailDB, email: str) -> str:
    for user_id, user in db.items("users"):
        if user["email"].lower() == email.lower():
            return user_id
    return "Error: user not found"


def find_user_id_by_name_zip(db: RetailDB, first_name: str, last_name: str, zip: str) -> str:
    for user_id, user in db.items("users"):
        if (
            user["name"]["first_name"].lower() == first_name.lower()
            and user["name"]["last_name"].lower() == last_name.lower()
            and user["address"]["zip"] == zip
        ):
            return user_id
    return "Error: user not found"


def get_order_details(db: RetailDB, order_id: str) -> str:
    order = _order(db, order_id)
    return _dump(order) if order is not None else "Error: order not found"


def get_product_details(db: RetailDB, product_id: str) -> str:
    product = db.get("products", product_id)
    return _dump(product) if product is not None else "Error: product not found"


def get_user_details(db: RetailDB, user_id: str) -> str:
    user = db.get("users", user_id)
    return _dump(user) if user is not None else "Error: user not found"


def list_all_product_types(db: RetailDB) -> str:
    names = {product["name"]: product["product_id"] for _, product in db.items("products")}
    return _dump(dict(sorted(names.items())))


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_ALLOWED_CHARS = frozenset("0123456789+-*/(). ")


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 100 or abs(left) > 1e6):
            raise ValueError("exponent too large")
        return _BINARY[type(node.op)](left, right)
    raise ValueError("unsupported expression")


def calculate_expression(expression: str) -> str:
    """Evaluate arithmetic safely (no ``eval``) and round to 2 decimals, as τ-bench's ``calculate`` does.

    Args:
        expression: digits, ``+ - * / ( ) .`` and spaces, e.g. ``"135.24 - 153.23"``.

    Returns:
        ``str(round(value, 2))``, e.g. ``"-17.99"``, or ``"Error: ..."``.
    """
    if not all(char in _ALLOWED_CHARS for char in expression):
        return "Error: invalid characters in expression"
    try:
        return str(round(float(_evaluate(ast.parse(expression, mode="eval"))), 2))
    except (SyntaxError, ValueError, ArithmeticError, RecursionError) as exc:
        return f"Error: {exc}"


def calculate(db: RetailDB, expression: str) -> str:
    return calculate_expression(expression)


def think(db: RetailDB, thought: str) -> str:
    return ""


def transfer_to_human_agents(db: RetailDB, summary: str) -> str:
    return "Transfer successful"


#: Tools that never change the database.
READ_TOOLS: dict[str, Tool] = {
    "calculate": calculate,
    "find_user_id_by_email": find_user_id_by_email,
    "find_user_id_by_name_zip": find_user_id_by_name_zip,
    "get_order_details": get_order_details,
    "get_product_details": get_product_details,
    "get_user_details": get_user_details,
    "list_all_product_types": list_all_product_types,
    "think": think,
    "transfer_to_human_agents": transfer_to_human_agents,
}
#: Tools that may change the database (only the calling rollout's view).
WRITE_TOOLS: dict[str, Tool] = {
    "cancel_pending_order": cancel_pending_order,
    "exchange_delivered_order_items": exchange_delivered_order_items,
    "modify_pending_order_address": modify_pending_order_address,
    "modify_pending_order_items": modify_pending_order_items,
    "modify_pending_order_payment": modify_pending_order_payment,
    "modify_user_address": modify_user_address,
    "return_delivered_order_items": return_delivered_order_items,
}
#: All 16 tools by name.
TOOLS: dict[str, Tool] = {**READ_TOOLS, **WRITE_TOOLS}


def _argument_error(name: str, arguments: Mapping[str, Any]) -> str | None:
    """Check ``arguments`` against the tool's JSON schema: required, unknown and (array of) string types."""
    schema = next(s["function"]["parameters"] for s in _schemas() if s["function"]["name"] == name)
    properties: dict[str, Any] = schema.get("properties", {})
    missing = [key for key in schema.get("required", []) if key not in arguments]
    if missing:
        return f"Error: {name} is missing required argument(s): {', '.join(missing)}"
    unknown = [key for key in arguments if key not in properties]
    if unknown:
        return f"Error: {name} got unexpected argument(s): {', '.join(unknown)}; expected: {', '.join(properties)}"
    for key, value in arguments.items():
        kind = properties[key].get("type")
        if kind == "string" and not isinstance(value, str):
            return f"Error: argument {key!r} must be a string, got {type(value).__name__}"
        if kind == "array" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            return f"Error: argument {key!r} must be a list of strings"
    return None


def call_tool(db: RetailDB, name: str, arguments: Mapping[str, Any] | str | None = None) -> str:
    """Run tool ``name`` on ``db`` and return its output; every agent mistake becomes ``"Error: ..."``.

    Args:
        db: the rollout's database view (only it is written).
        name: one of :data:`TOOLS`.
        arguments: keyword arguments as a dict, or the raw JSON string of a model's tool call;
            ``None`` or ``""`` means no arguments.

    Returns:
        The tool's output string (see the module docstring).
    """
    tool = TOOLS.get(name)
    if tool is None:
        return f"Error: unknown tool {name!r}; available tools: {', '.join(TOOLS)}"
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    elif isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return f"Error: arguments are not valid JSON ({exc})"
    if not isinstance(arguments, Mapping):
        return f"Error: arguments must be a JSON object, got {type(arguments).__name__}"
    error = _argument_error(name, arguments)
    if error is not None:
        return error
    try:
        return tool(db, **arguments)
    except (
        KeyError,
        IndexError,
        TypeError,
        ValueError,
    ) as exc:  # inconsistent records, as τ-bench reports them
        return f"Error: {type(exc).__name__}: {exc}"
