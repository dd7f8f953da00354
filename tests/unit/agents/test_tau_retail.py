"""τ-retail tools, database views and the gold-task replay, on the real τ-bench data (../shared/data)."""

from __future__ import annotations

import json
import re
import time
from collections import Counter

import pytest
from prerequisites import load_data

from agentforge.agents.customer_service.rewards import tau_reward, tau_reward_details
from agentforge.agents.customer_service.tau_retail import (
    READ_TOOLS,
    TOOLS,
    WRITE_TOOLS,
    RetailData,
    calculate_expression,
    canonical_hash,
    load_tau_retail,
    load_tau_tasks,
    tool_schemas,
)
from agentforge.errors import UserError
from agentforge.types import Task


@pytest.fixture(scope="module")
def env():
    return load_data(load_tau_retail)


def _replay(env, task: Task):
    db = env.new_db()
    errors = []
    for i, action in enumerate(task.metadata["actions"]):
        out = db.call_tool(action["name"], action["kwargs"])
        if out.startswith("Error"):
            errors.append((task.metadata["split"], task.metadata["index"], i, out))
    return db, errors


#: Gold actions that return an error under the policy, pinned. Read-only ones are deliberate detours of
#: the human-written test tasks (the customer gives a wrong email, zip or order id first; the recorded
#: agent looked up an item id as a product id). Write ones break a policy rule; the benchmark's gold
#: database is then the one where that action changed nothing (checked independently below).
GIFT_CARD = "Error: insufficient gift card balance to pay for the "
EXPECTED_GOLD_ERRORS = {
    **{
        ("train", i, a): GIFT_CARD + "order"
        for i, a in [(24, 0), (27, 0), (148, 1), (253, 0), (351, 2), (369, 0), (427, 0), (431, 4), (469, 0)]
    },
    **{
        ("train", i, a): GIFT_CARD + "new item"
        for i, a in [(81, 1), (161, 0), (229, 0), (314, 3), (349, 0), (351, 6), (376, 1), (441, 0)]
    },
    **{
        (s, i, a): GIFT_CARD + "price difference"
        for s, i, a in [("train", 214, 0), ("train", 252, 0), ("train", 288, 0), ("test", 106, 0)]
    },
    **{
        ("test", i, 4): "Error: payment method should be either the original payment method or a gift card"
        for i in (12, 13)
    },
    ("test", 64, 6): "Error: non-delivered order cannot be exchanged",
    **{
        ("test", i, a): "Error: product not found"
        for i, a in [(2, 1), (3, 1), (4, 1), (21, 5), (21, 6), (21, 8)]
    },
    **{
        ("test", i, a): "Error: user not found"
        for i, a in [(35, 0), (36, 0), (37, 0), (38, 0), (39, 0), (54, 0), (55, 0), (67, 0), (67, 1), (68, 0)]
    },
    **{("test", i, a): "Error: order not found" for i, a in [(46, 1), (46, 2), (47, 1), (47, 2)]},
}


def test_every_gold_task_replays_and_scores_one(env):
    start = time.perf_counter()
    counts, errors, scored = Counter(), {}, 0
    for split in ("train", "dev", "test"):
        for task in env.tasks(split):
            counts[split] += 1
            db, task_errors = _replay(env, task)
            errors.update({(s, i, a): out for s, i, a, out in task_errors})
            said = [f"Sure. The answer is {o}." for o in task.metadata["outputs"]]
            result = tau_reward_details(db, task, said)
            assert result.reward == 1.0, (task.task_id, result)
            scored += 1
    assert counts == {"train": 500, "dev": 20, "test": 115} and scored == 635
    assert errors == EXPECTED_GOLD_ERRORS
    assert time.perf_counter() - start < 20


def test_gold_write_errors_are_real_policy_violations(env):
    """Check each pinned write error against the records as they stand before the failing action."""
    variants = {k: v for _, p in env.data.items("products") for k, v in p["variants"].items()}
    checked = 0
    for (split, index, a), message in EXPECTED_GOLD_ERRORS.items():
        actions = env.tasks(split)[index].metadata["actions"]
        if actions[a]["name"] in READ_TOOLS:
            continue
        db = env.new_db()
        for earlier in actions[:a]:
            db.call_tool(earlier["name"], earlier["kwargs"])
        kw = actions[a]["kwargs"]
        order = db.record("orders", kw["order_id"])
        methods = db.record("users", order["user_id"])["payment_methods"]
        if message.startswith(GIFT_CARD):
            if actions[a]["name"] == "modify_pending_order_payment":
                needed = order["payment_history"][0]["amount"]
            else:
                prices = {i["item_id"]: i["price"] for i in order["items"]}
                needed = sum(
                    variants[n]["price"] - prices[o]
                    for o, n in zip(kw["item_ids"], kw["new_item_ids"], strict=True)
                )
            assert methods[kw["payment_method_id"]]["balance"] < needed, (split, index, a)
        elif "original payment method" in message:
            assert "gift_card" not in kw["payment_method_id"]
            assert kw["payment_method_id"] != order["payment_history"][0]["payment_method_id"]
        else:
            assert order["status"] != "delivered"
        checked += 1
    assert checked == 24


def _perturb(db, action):
    """The write action with one argument changed (to another valid value where one exists)."""
    kw = dict(action["kwargs"])
    order = db.get("orders", kw.get("order_id", ""))
    if action["name"] == "cancel_pending_order":
        kw["reason"] = next(r for r in ("no longer needed", "ordered by mistake") if r != kw["reason"])
    elif action["name"] in ("modify_pending_order_address", "modify_user_address"):
        kw["zip"] = str(int(kw["zip"]) + 1).zfill(5)
    elif "new_item_ids" in kw:
        item = next(i for i in order["items"] if i["item_id"] == kw["item_ids"][0])
        variants = db.get("products", item["product_id"])["variants"]
        other = [
            k
            for k, v in variants.items()
            if v["available"] and k not in (kw["new_item_ids"][0], item["item_id"])
        ]
        kw["new_item_ids"] = [other[0] if other else "0000000000", *kw["new_item_ids"][1:]]
    elif action["name"] == "return_delivered_order_items":  # one item fewer, or another item
        others = [i["item_id"] for i in order["items"] if i["item_id"] not in kw["item_ids"]]
        if len(kw["item_ids"]) > 1:
            kw["item_ids"] = kw["item_ids"][:-1]
        elif others:
            kw["item_ids"] = others[:1]
        else:
            methods = db.get("users", order["user_id"])["payment_methods"]
            cards = [m for m in methods if "gift_card" in m and m != kw["payment_method_id"]]
            kw["payment_method_id"] = cards[0] if cards else "gift_card_0000000"  # unknown: the call fails
    else:  # payment change: another payment method of the same user
        methods = db.get("users", order["user_id"])["payment_methods"]
        other = [m for m in methods if m != kw["payment_method_id"]]
        kw["payment_method_id"] = other[0] if other else "paypal_0000000"
    return {"name": action["name"], "kwargs": kw}


def test_one_wrong_argument_scores_zero(env):
    """Change one argument of a task's last successful write action: the database differs, reward 0."""
    perturbed, with_write = 0, 0
    for split in ("train", "dev", "test"):
        for task in env.tasks(split):
            actions = task.metadata["actions"]
            db, last = env.new_db(), None
            for i, action in enumerate(actions):
                before = db.fork()
                if action["name"] in WRITE_TOOLS and not db.call_tool(
                    action["name"], action["kwargs"]
                ).startswith("Error"):
                    last = (i, before)
                elif action["name"] not in WRITE_TOOLS:
                    db.call_tool(action["name"], action["kwargs"])
            if last is None:
                continue
            with_write += 1
            i, state = last
            wrong = _perturb(state, actions[i])
            assert wrong["kwargs"] != actions[i]["kwargs"]
            agent = env.new_db()
            for step in [*actions[:i], wrong, *actions[i + 1 :]]:
                agent.call_tool(step["name"], step["kwargs"])
            assert tau_reward(agent, task, task.metadata["outputs"]) == 0.0, (task.task_id, wrong)
            perturbed += 1
    assert perturbed == with_write == 618  # the other 17 tasks have no successful write action


def _infer_call(db, record):
    """The tool call that turns the current state into a record shown in a real trajectory."""
    if "variants" in record:
        return "get_product_details", {"product_id": record["product_id"]}
    if "order_id" not in record:
        return "list_all_product_types", {}
    oid, status = record["order_id"], record["status"]
    current = db.get("orders", oid)
    if status == "cancelled" and current["status"] == "pending":
        return "cancel_pending_order", {"order_id": oid, "reason": record["cancel_reason"]}
    if status == "return requested" and current["status"] == "delivered":
        return "return_delivered_order_items", {
            "order_id": oid,
            "item_ids": record["return_items"],
            "payment_method_id": record["return_payment_method_id"],
        }
    if status == "exchange requested" and current["status"] == "delivered":
        old, new = record["exchange_items"], list(record["exchange_new_items"])
        product_of = {i["item_id"]: i["product_id"] for i in current["items"]}
        paired = [next(n for n in new if n in db.get("products", product_of[o])["variants"]) for o in old]
        return "exchange_delivered_order_items", {
            "order_id": oid,
            "item_ids": old,
            "new_item_ids": paired,
            "payment_method_id": record["exchange_payment_method_id"],
        }
    if status == "pending (item modified)" and current["status"] == "pending":
        pairs = [
            (a["item_id"], b["item_id"])
            for a, b in zip(current["items"], record["items"], strict=True)
            if a["item_id"] != b["item_id"]
        ]
        return "modify_pending_order_items", {
            "order_id": oid,
            "item_ids": [a for a, _ in pairs],
            "new_item_ids": [b for _, b in pairs],
            "payment_method_id": record["payment_history"][-1]["payment_method_id"],
        }
    if status == "pending" and record["address"] != current["address"]:
        return "modify_pending_order_address", {"order_id": oid, **record["address"]}
    if status == "pending" and len(record["payment_history"]) == 3 and len(current["payment_history"]) == 1:
        return "modify_pending_order_payment", {
            "order_id": oid,
            "payment_method_id": record["payment_history"][1]["payment_method_id"],
        }
    return "get_order_details", {"order_id": oid}


def test_tool_outputs_match_real_trajectories(env):
    """Every order/product/catalogue output in few_shot_trajectories.jsonl is reproduced byte for byte.

    User records there come from an older data version (``province`` instead of ``state``), so they are
    skipped; the state changes before each output are replayed in one database per trajectory.
    """
    path = env.data_dir / "few_shot_trajectories.jsonl"
    matched = Counter()
    for line in path.read_text(encoding="utf-8").splitlines():
        db = env.new_db()
        turns = re.split(r"\n(?=(?:user|assistant|tool): )", json.loads(line)["messages_display"])
        for turn in turns:
            if not turn.startswith("tool: {"):
                continue
            expected = turn.removeprefix("tool: ")
            record = json.loads(expected)
            if "payment_methods" in record:
                continue
            name, args = _infer_call(db, record)
            assert db.call_tool(name, args) == expected, (name, args)
            matched[name] += 1
    assert set(matched) == {
        "get_order_details",
        "get_product_details",
        "list_all_product_types",
        "cancel_pending_order",
        "return_delivered_order_items",
        "exchange_delivered_order_items",
        "modify_pending_order_items",
        "modify_pending_order_address",
        "modify_pending_order_payment",
    }
    assert sum(matched.values()) >= 290


# -- edge cases -------------------------------------------------------------------------------------


def _order_with_status(env, status):
    return next(oid for oid, o in env.data.items("orders") if o["status"] == status)


def test_unknown_ids_and_wrong_status_return_errors_and_change_nothing(env):
    db = env.new_db()
    base = db.db_hash()
    assert db.call_tool("get_order_details", {"order_id": "#W0000000"}) == "Error: order not found"
    assert (
        db.call_tool("cancel_pending_order", {"order_id": "W0000000", "reason": "no longer needed"})
        == "Error: order not found"
    )
    assert db.call_tool("get_user_details", {"user_id": "nobody_1"}) == "Error: user not found"
    assert db.call_tool("get_product_details", {"product_id": "1"}) == "Error: product not found"
    delivered, pending = _order_with_status(env, "delivered"), _order_with_status(env, "pending")
    assert (
        db.call_tool("cancel_pending_order", {"order_id": delivered, "reason": "no longer needed"})
        == "Error: non-pending order cannot be cancelled"
    )
    assert (
        db.call_tool("cancel_pending_order", {"order_id": pending, "reason": "too expensive"})
        == "Error: invalid reason"
    )
    assert (
        db.call_tool(
            "return_delivered_order_items", {"order_id": pending, "item_ids": [], "payment_method_id": "x"}
        )
        == "Error: non-delivered order cannot be returned"
    )
    assert (
        db.call_tool(
            "exchange_delivered_order_items",
            {"order_id": pending, "item_ids": [], "new_item_ids": [], "payment_method_id": "x"},
        )
        == "Error: non-delivered order cannot be exchanged"
    )
    assert (
        db.call_tool("modify_pending_order_payment", {"order_id": delivered, "payment_method_id": "x"})
        == "Error: non-pending order cannot be modified"
    )
    order = db.get("orders", delivered)
    item = order["items"][0]["item_id"]
    assert (
        db.call_tool(
            "exchange_delivered_order_items",
            {
                "order_id": delivered,
                "item_ids": [item, item] * 5,
                "new_item_ids": [item] * 10,
                "payment_method_id": "x",
            },
        )
        == f"Error: {item} not found"
    )
    assert (
        db.call_tool(
            "exchange_delivered_order_items",
            {"order_id": delivered, "item_ids": [item], "new_item_ids": [], "payment_method_id": "x"},
        )
        == "Error: the number of items to be exchanged should match"
    )
    assert db.db_hash() == base and db.changed() == {}


def test_bad_arguments_are_errors_not_exceptions(env):
    db = env.new_db()
    assert db.call_tool("no_such_tool", {}).startswith("Error: unknown tool 'no_such_tool'")
    assert "missing required argument(s): reason" in db.call_tool("cancel_pending_order", {"order_id": "#W1"})
    assert "unexpected argument(s): force" in db.call_tool(
        "get_order_details", {"order_id": "#W1", "force": True}
    )
    assert (
        db.call_tool("find_user_id_by_name_zip", {"first_name": "A", "last_name": "B", "zip": 12345})
        == "Error: argument 'zip' must be a string, got int"
    )
    assert "must be a list of strings" in db.call_tool(
        "return_delivered_order_items", {"order_id": "#W1", "item_ids": "123", "payment_method_id": "x"}
    )
    assert db.call_tool("get_order_details", '{"order_id": ').startswith(
        "Error: arguments are not valid JSON"
    )
    assert db.call_tool("get_order_details", "[1]") == "Error: arguments must be a JSON object, got list"
    oid = next(iter(dict(env.data.items("orders"))))
    assert json.loads(db.call_tool("get_order_details", json.dumps({"order_id": oid})))["order_id"] == oid
    assert json.loads(db.call_tool("list_all_product_types", None))["T-Shirt"] == "9523456873"


def test_read_tools_do_not_change_the_hash(env):
    db = env.new_db()
    before = db.db_hash()
    user_id, user = next(iter(env.data.items("users")))
    order_id = user["orders"][0]
    calls = {
        "find_user_id_by_email": {"email": user["email"].upper()},
        "find_user_id_by_name_zip": {**user["name"], "zip": user["address"]["zip"]},
        "get_user_details": {"user_id": user_id},
        "get_order_details": {"order_id": order_id},
        "get_product_details": {"product_id": "9523456873"},
        "list_all_product_types": {},
        "calculate": {"expression": "(2 + 3) * 4 / 3"},
        "think": {"thought": "hmm"},
        "transfer_to_human_agents": {"summary": "help"},
    }
    assert set(calls) == set(READ_TOOLS)
    outputs = {name: db.call_tool(name, args) for name, args in calls.items()}
    assert outputs["find_user_id_by_email"] == outputs["find_user_id_by_name_zip"] == user_id
    assert (
        outputs["calculate"] == "6.67"
        and outputs["think"] == ""
        and outputs["transfer_to_human_agents"] == "Transfer successful"
    )
    assert db.db_hash() == before == env.data.base_hash and db.changed() == {}


def test_rollouts_are_isolated_and_hash_matches_the_benchmark_definition(env):
    pending = next(
        oid
        for oid, o in env.data.items("orders")
        if o["status"] == "pending" and "gift_card" in o["payment_history"][0]["payment_method_id"]
    )
    user_id = env.data.get("orders", pending)["user_id"]
    card = env.data.get("orders", pending)["payment_history"][0]["payment_method_id"]
    balance, amount = (
        env.data.get("users", user_id)["payment_methods"][card]["balance"],
        env.data.get("orders", pending)["payment_history"][0]["amount"],
    )
    a, b = env.new_db(), env.new_db()
    out = json.loads(
        a.call_tool("cancel_pending_order", {"order_id": pending, "reason": "ordered by mistake"})
    )
    assert out["status"] == "cancelled" and out["cancel_reason"] == "ordered by mistake"
    assert out["payment_history"][-1] == {
        "transaction_type": "refund",
        "amount": amount,
        "payment_method_id": card,
    }
    assert a.get("users", user_id)["payment_methods"][card]["balance"] == round(balance + amount, 2)
    # b and the shared snapshot are untouched
    assert (
        b.get("orders", pending)["status"] == "pending"
        and env.data.get("orders", pending)["status"] == "pending"
    )
    assert env.data.get("users", user_id)["payment_methods"][card]["balance"] == balance
    assert b.db_hash() == env.data.base_hash != a.db_hash()
    assert a.db_hash() == canonical_hash(a.to_dict())
    assert env.data.base_hash == canonical_hash(env.data.snapshot())
    fork = a.fork()
    fork.call_tool(
        "modify_user_address",
        {
            "user_id": user_id,
            "address1": "1 Main St",
            "address2": "",
            "city": "X",
            "state": "CA",
            "country": "USA",
            "zip": "00001",
        },
    )
    assert a.get("users", user_id)["address"]["zip"] != "00001" and fork.db_hash() == canonical_hash(
        fork.to_dict()
    )


def test_new_db_and_hash_are_cheap(env, monkeypatch):
    """A view copies nothing until it writes, and its hash re-serialises only the records it changed (counted,
    not timed: a timed bound flakes on a busy host; the module docstring gives the measured costs)."""
    from agentforge.agents.customer_service.tau_retail import db as db_module

    copies, dumps = [], []
    real_deepcopy, real_dumps = db_module.copy.deepcopy, db_module.json.dumps
    monkeypatch.setattr(
        db_module.copy, "deepcopy", lambda obj, *a: copies.append(1) or real_deepcopy(obj, *a)
    )
    monkeypatch.setattr(db_module.json, "dumps", lambda obj, **kw: dumps.append(1) or real_dumps(obj, **kw))
    dbs = [env.new_db() for _ in range(1000)]
    assert copies == [] and len({d.db_hash() for d in dbs}) == 1 and dumps == []  # O(1) a rollout
    oid = _order_with_status(env, "pending")
    dbs[0].call_tool(
        "modify_pending_order_address",
        {
            "order_id": oid,
            "address1": "a",
            "address2": "b",
            "city": "c",
            "state": "d",
            "country": "e",
            "zip": "f",
        },
    )
    copies.clear(), dumps.clear()
    changed = dbs[0].db_hash()
    rows = sum(len(env.data._entries[name]) for name in db_module.TABLES)
    assert (
        dbs[0].changed() and len(dumps) <= 8 < rows
    )  # the table names and the changed records, not every record
    assert changed == canonical_hash(dbs[0].to_dict()) != dbs[1].db_hash()


def test_calculate_is_safe_arithmetic():
    assert calculate_expression("135.24 - 153.23") == "-17.99"
    assert calculate_expression("2 ** 10") == "1024.0"
    assert calculate_expression("__import__('os')") == "Error: invalid characters in expression"
    assert calculate_expression("1 / 0") == "Error: division by zero"
    assert calculate_expression("9 ** 9 ** 9").startswith("Error")
    assert calculate_expression("(1 +").startswith("Error")


def test_schemas_match_the_data_and_the_tools(env):
    schemas = tool_schemas()
    assert schemas == json.loads((env.data_dir / "tools.json").read_text(encoding="utf-8"))
    assert [s["function"]["name"] for s in schemas] == sorted(TOOLS) and len(TOOLS) == 16
    schemas[0]["function"]["name"] = "edited"
    assert tool_schemas()[0]["function"]["name"] == "calculate"


def test_tasks_are_agentforge_tasks(env):
    task = load_tau_tasks("test")[0]
    assert task.task_id == "tau_retail_v1/test/0"
    assert task.input == {"instruction": task.input["instruction"], "user_id": "yusuf_rossi_9620"}
    assert task.metadata["split"] == "test" and task.metadata["index"] == 0 and task.metadata["outputs"] == []
    assert task.metadata["actions"][-1]["name"] == "exchange_delivered_order_items"
    assert load_tau_retail() is env and "Retail agent policy" in env.wiki and len(env.rules) == 7
    with pytest.raises(UserError, match="unknown τ-retail split"):
        load_tau_tasks("validation")


def test_missing_data_is_a_clear_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTFORGE_DATA_DIR", str(tmp_path))
    with pytest.raises(
        UserError, match=r"τ-retail data not found at .*tau_retail/v1; set AGENTFORGE_DATA_DIR"
    ):
        load_tau_retail()
    with pytest.raises(UserError, match="τ-retail data not found"):
        load_tau_retail(tmp_path)


def test_retail_data_validates_tables():
    with pytest.raises(UserError, match="exactly the tables"):
        RetailData({"orders": {}, "users": {}})
    tiny = RetailData({"orders": {}, "products": {}, "users": {}})
    assert tiny.new_db().db_hash() == canonical_hash({"orders": {}, "products": {}, "users": {}})


def test_write_tools_record_what_tau_bench_records(env):
    db = env.new_db()
    delivered = next(
        o
        for _, o in env.data.items("orders")
        if o["status"] == "delivered" and len({i["item_id"] for i in o["items"]}) > 2
    )
    ids = [i["item_id"] for i in delivered["items"]]
    original = delivered["payment_history"][0]["payment_method_id"]
    out = json.loads(
        db.fork().call_tool(
            "return_delivered_order_items",
            {"order_id": delivered["order_id"], "item_ids": ids[::-1], "payment_method_id": original},
        )
    )
    assert out["status"] == "return requested" and out["return_items"] == sorted(ids)
    assert (
        out["return_payment_method_id"] == original and out["payment_history"] == delivered["payment_history"]
    )
    # exchange: sorted lists, price difference rounded to cents
    swaps = []
    for item in delivered["items"][:2]:
        variants = env.data.get("products", item["product_id"])["variants"]
        swaps.append(next(k for k, v in variants.items() if v["available"] and k != item["item_id"]))
    out = json.loads(
        db.call_tool(
            "exchange_delivered_order_items",
            {
                "order_id": delivered["order_id"],
                "item_ids": ids[1::-1],
                "new_item_ids": swaps[::-1],
                "payment_method_id": original,
            },
        )
    )
    assert out["status"] == "exchange requested"
    assert out["exchange_items"] == sorted(ids[:2]) and out["exchange_new_items"] == sorted(swaps)
    variants = {k: v for _, p in env.data.items("products") for k, v in p["variants"].items()}
    diff = sum(variants[n]["price"] - i["price"] for n, i in zip(swaps, delivered["items"][:2], strict=True))
    assert out["exchange_price_difference"] == round(diff, 2)
    assert [i["item_id"] for i in out["items"]] == ids  # items themselves are unchanged until the return
    assert db.call_tool(
        "return_delivered_order_items",
        {"order_id": delivered["order_id"], "item_ids": ids[:1], "payment_method_id": original},
    ) == ("Error: non-delivered order cannot be returned")


def test_modify_items_handles_duplicate_items(env):
    db = env.new_db()
    order_id, order = next(
        (k, o)
        for k, o in env.data.items("orders")
        if o["status"] == "pending"
        and len(o["items"]) >= 2
        and o["items"][0]["item_id"] == o["items"][1]["item_id"]
    )
    item = order["items"][0]
    variants = env.data.get("products", item["product_id"])["variants"]
    a, b = [k for k, v in variants.items() if v["available"] and k != item["item_id"]][:2]
    method = next(iter(env.data.get("users", order["user_id"])["payment_methods"]))
    out = db.call_tool(
        "modify_pending_order_items",
        {
            "order_id": order_id,
            "item_ids": [item["item_id"]] * 2,
            "new_item_ids": [a, b],
            "payment_method_id": method,
        },
    )
    diff = 0.0
    for new in (a, b):  # accumulated pair by pair, unrounded, as τ-bench does
        diff += variants[new]["price"] - item["price"]
    record = json.loads(out)
    assert [i["item_id"] for i in record["items"][:2]] == [a, b]
    assert record["status"] == "pending (item modified)"
    assert record["items"][0]["options"] == variants[a]["options"]
    assert record["items"][1]["price"] == variants[b]["price"]
    kind = "payment" if diff > 0 else "refund"
    assert record["payment_history"][-1] == {
        "transaction_type": kind,
        "amount": abs(diff),
        "payment_method_id": method,
    }
    assert (
        db.call_tool(
            "modify_pending_order_items",
            {"order_id": order_id, "item_ids": [a], "new_item_ids": [b], "payment_method_id": method},
        )
        == "Error: non-pending order cannot be modified"
    )
