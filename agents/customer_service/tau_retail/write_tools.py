"""The seven τ-retail tools that change the database (only the calling rollout's view).

Written from the policy (``wiki.md``) and checked against the real outputs in
``few_shot_trajectories.jsonl``: the order record gains exactly the fields τ-bench sets
(``cancel_reason``; ``exchange_items``/``exchange_new_items`` sorted, ``exchange_payment_method_id``,
``exchange_price_difference`` rounded to cents; ``return_items`` sorted, ``return_payment_method_id``;
status ``"pending (item modified)"`` with an unrounded refund/payment entry), and gift-card balances
move with every refund or payment, rounded to cents. Every check runs before the first write, so a
call that returns ``"Error: ..."`` changes nothing.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentforge.agents.customer_service.tau_retail.db import RetailDB

__all__ = [
    "CANCEL_REASONS",
    "cancel_pending_order",
    "exchange_delivered_order_items",
    "modify_pending_order_address",
    "modify_pending_order_items",
    "modify_pending_order_payment",
    "modify_user_address",
    "return_delivered_order_items",
]

#: The two cancellation reasons the policy accepts.
CANCEL_REASONS = ("no longer needed", "ordered by mistake")


def _order(db: RetailDB, order_id: str) -> dict[str, Any] | None:
    return db.get("orders", order_id)


def _linked(db: RetailDB, table: str, key: str) -> dict[str, Any]:
    """The record another one names (an order's user, an order item's product), which the data holds.

    Raises:
        KeyError: it does not (inconsistent records: ``call_tool`` reports it, as τ-bench does).
    """
    record = db.get(table, key)
    if record is None:
        raise KeyError(key)
    return record


def _dump(record: Any) -> str:
    return json.dumps(record)


def cancel_pending_order(db: RetailDB, order_id: str, reason: str) -> str:
    order = _order(db, order_id)
    if order is None:
        return "Error: order not found"
    if order["status"] != "pending":
        return "Error: non-pending order cannot be cancelled"
    if reason not in CANCEL_REASONS:
        return "Error: invalid reason"
    order = db.writable("orders", order_id)
    refunds = []
    for payment in order["payment_history"]:
        method_id = payment["payment_method_id"]
        refunds.append(
            {"transaction_type": "refund", "amount": payment["amount"], "payment_method_id": method_id}
        )
        if "gift_card" in method_id:
            method = db.writable("users", order["user_id"])["payment_methods"][method_id]
            method["balance"] = round(method["balance"] + payment["amount"], 2)
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    order["payment_history"].extend(refunds)
    return _dump(order)


def _check_items(order: Mapping[str, Any], item_ids: list[str]) -> str | None:
    """Return the failing item id if ``item_ids`` (with repeats) is not a sub-multiset of the order's."""
    in_order = [item["item_id"] for item in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > in_order.count(item_id):
            return item_id
    return None


def _price_difference(
    db: RetailDB, order: Mapping[str, Any], item_ids: list[str], new_item_ids: list[str]
) -> float | str:
    """Sum of new minus old prices (unrounded), or an error string for an unknown/unavailable new item."""
    difference = 0.0
    for item_id, new_item_id in zip(item_ids, new_item_ids, strict=True):
        item = next(item for item in order["items"] if item["item_id"] == item_id)
        variants = _linked(db, "products", item["product_id"])["variants"]
        variant = variants.get(new_item_id)
        if variant is None or not variant["available"]:
            return f"Error: new item {new_item_id} not found or available"
        difference += variant["price"] - item["price"]
    return difference


def _swap_checks(
    db: RetailDB,
    order: Mapping[str, Any],
    item_ids: list[str],
    new_item_ids: list[str],
    payment_method_id: str,
) -> tuple[float, dict[str, Any]] | str:
    """Shared checks of exchange and modify-items: returns (unrounded difference, payment method) or an error."""
    missing = _check_items(order, item_ids)
    if missing is not None:
        return f"Error: {missing} not found"
    if len(item_ids) != len(new_item_ids):
        return "Error: the number of items to be exchanged should match"
    difference = _price_difference(db, order, item_ids, new_item_ids)
    if isinstance(difference, str):
        return difference
    method = _linked(db, "users", order["user_id"])["payment_methods"].get(payment_method_id)
    if method is None:
        return "Error: payment method not found"
    return difference, method


def exchange_delivered_order_items(
    db: RetailDB, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> str:
    order = _order(db, order_id)
    if order is None:
        return "Error: order not found"
    if order["status"] != "delivered":
        return "Error: non-delivered order cannot be exchanged"
    checked = _swap_checks(db, order, item_ids, new_item_ids, payment_method_id)
    if isinstance(checked, str):
        return checked
    difference, method = round(checked[0], 2), checked[1]
    if method["source"] == "gift_card" and method["balance"] < difference:
        return "Error: insufficient gift card balance to pay for the price difference"
    order = db.writable("orders", order_id)
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(item_ids)
    order["exchange_new_items"] = sorted(new_item_ids)
    order["exchange_payment_method_id"] = payment_method_id
    order["exchange_price_difference"] = difference
    return _dump(order)


def modify_pending_order_items(
    db: RetailDB, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> str:
    order = _order(db, order_id)
    if order is None:
        return "Error: order not found"
    if order["status"] != "pending":
        return "Error: non-pending order cannot be modified"
    checked = _swap_checks(db, order, item_ids, new_item_ids, payment_method_id)
    if isinstance(checked, str):
        return checked
    difference, method = checked  # τ-bench does not round here: the refund keeps float noise
    if method["source"] == "gift_card" and method["balance"] < difference:
        return "Error: insufficient gift card balance to pay for the new item"
    order = db.writable("orders", order_id)
    order["payment_history"].append(
        {
            "transaction_type": "payment" if difference > 0 else "refund",
            "amount": abs(difference),
            "payment_method_id": payment_method_id,
        }
    )
    if method["source"] == "gift_card":
        method = db.writable("users", order["user_id"])["payment_methods"][payment_method_id]
        method["balance"] = round(method["balance"] - difference, 2)
    for item_id, new_item_id in zip(item_ids, new_item_ids, strict=True):
        item = next(item for item in order["items"] if item["item_id"] == item_id)
        variant = _linked(db, "products", item["product_id"])["variants"][new_item_id]
        item["item_id"] = new_item_id
        item["price"] = variant["price"]
        item["options"] = copy.deepcopy(variant["options"])
    order["status"] = "pending (item modified)"
    return _dump(order)


def _address(address1: str, address2: str, city: str, state: str, country: str, zip: str) -> dict[str, str]:
    return {
        "address1": address1,
        "address2": address2,
        "city": city,
        "state": state,
        "country": country,
        "zip": zip,
    }


def modify_pending_order_address(db: RetailDB, order_id: str, **address: str) -> str:
    order = _order(db, order_id)
    if order is None:
        return "Error: order not found"
    if order["status"] != "pending":
        return "Error: non-pending order cannot be modified"
    order = db.writable("orders", order_id)
    order["address"] = _address(**address)
    return _dump(order)


def modify_pending_order_payment(db: RetailDB, order_id: str, payment_method_id: str) -> str:
    order = _order(db, order_id)
    if order is None:
        return "Error: order not found"
    if order["status"] != "pending":
        return "Error: non-pending order cannot be modified"
    methods = _linked(db, "users", order["user_id"])["payment_methods"]
    if payment_method_id not in methods:
        return "Error: payment method not found"
    history = order["payment_history"]
    if len(history) != 1 or history[0]["transaction_type"] != "payment":
        return "Error: there should be exactly one payment for a pending order"
    old_method_id, amount = history[0]["payment_method_id"], history[0]["amount"]
    if old_method_id == payment_method_id:
        return "Error: the new payment method should be different from the current one"
    if methods[payment_method_id]["source"] == "gift_card" and methods[payment_method_id]["balance"] < amount:
        return "Error: insufficient gift card balance to pay for the order"
    order = db.writable("orders", order_id)
    order["payment_history"].extend(
        [
            {"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id},
            {"transaction_type": "refund", "amount": amount, "payment_method_id": old_method_id},
        ]
    )
    new_is_gift_card = methods[payment_method_id]["source"] == "gift_card"
    old_is_gift_card = "gift_card" in old_method_id
    if new_is_gift_card or old_is_gift_card:
        user_methods = db.writable("users", order["user_id"])["payment_methods"]
        if new_is_gift_card:
            user_methods[payment_method_id]["balance"] = round(
                user_methods[payment_method_id]["balance"] - amount, 2
            )
        if old_is_gift_card:
            user_methods[old_method_id]["balance"] = round(user_methods[old_method_id]["balance"] + amount, 2)
    return _dump(order)


def modify_user_address(db: RetailDB, user_id: str, **address: str) -> str:
    if db.get("users", user_id) is None:
        return "Error: user not found"
    user = db.writable("users", user_id)
    user["address"] = _address(**address)
    return _dump(user)


def return_delivered_order_items(
    db: RetailDB, order_id: str, item_ids: list[str], payment_method_id: str
) -> str:
    order = _order(db, order_id)
    if order is None:
        return "Error: order not found"
    if order["status"] != "delivered":
        return "Error: non-delivered order cannot be returned"
    if payment_method_id not in _linked(db, "users", order["user_id"])["payment_methods"]:
        return "Error: payment method not found"
    if (
        "gift_card" not in payment_method_id
        and payment_method_id != order["payment_history"][0]["payment_method_id"]
    ):
        return "Error: payment method should be either the original payment method or a gift card"
    if _check_items(order, item_ids) is not None:
        return "Error: some item not found"
    order = db.writable("orders", order_id)
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    return _dump(order)
