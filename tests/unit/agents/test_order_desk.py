"""The order desk (Bitext order messages + τ-retail facts), its tool backend, the tool-turn reward parts, and
the order bot's turn through the real gateway with a scripted policy (the real-engine run is
``tests/integration/test_order_bot_vllm.py``)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from cs_helpers import call, scripted_gateway

from agentforge.agents.customer_service.datasets import load_bitext
from agentforge.agents.customer_service.order_bot import OrderDeskAgent
from agentforge.agents.customer_service.order_desk import (
    INTENT_TOOL,
    STATUSES,
    OrderDesk,
    order_desk_tasks,
    order_for_row,
)
from agentforge.agents.customer_service.rewards.tool_turn import (
    PARTS,
    make_tool_turn_reward_func,
    normalize_arguments,
    score_tool_turn,
)
from agentforge.agents.customer_service.tau_retail import load_tau_retail
from agentforge.errors import UserError
from agentforge.runtime import Runner, enqueue_tasks
from agentforge.types import RolloutState, SpanKind


@pytest.fixture(scope="module")
def tasks() -> tuple[list, list]:
    return order_desk_tasks()


def test_tasks_are_bitext_order_messages_with_tau_orders(tasks: tuple[list, list]) -> None:
    train, held_out = tasks
    assert (len(train), len(held_out)) == (431, 42)
    assert {t.metadata["split"] for t in train} == {"train"} and {t.metadata["split"] for t in held_out} == {
        "test"
    }
    assert not {t.task_id for t in train} & {t.task_id for t in held_out}
    env = load_tau_retail()
    bitext = {t.metadata["index"]: t for t in load_bitext()}
    for task in train + held_out:
        meta, source = task.metadata, bitext[task.metadata["index"]]
        # the Bitext message with its order number replaced by the row's τ-retail order id, nothing else
        original = source.input["text"]
        assert task.input["text"] == original.replace(meta["bitext_order_number"], meta["order_id"], 1)
        assert (
            meta["order_id"] == order_for_row(env, meta["index"]) and meta["order_id"] in task.input["text"]
        )
        assert meta["gold_tool"] == INTENT_TOOL[source.metadata["intent"]]
        assert meta["gold_arguments"] == {"order_id": meta["order_id"]}
        status = env.data.get("orders", meta["order_id"])["status"]
        expected = "cancelled" if meta["gold_tool"] == "cancel_order" and status == "pending" else status
        assert meta["gold_fact"] == expected
        assert sorted([*meta["fact_alternatives"], expected]) == sorted(STATUSES)
    assert {t.input["temperature"] for t in held_out} == {0.0} and {
        t.input["temperature"] for t in train
    } == {1.0}
    # all three tools and several facts in the held-out slice
    assert set(Counter(t.metadata["gold_tool"] for t in held_out)) == set(INTENT_TOOL.values())
    assert len({t.metadata["gold_fact"] for t in held_out}) == 4
    # round-robin over the intents: a 30-task slice holds each gold tool 10 times
    assert set(Counter(t.metadata["gold_tool"] for t in held_out[:30]).values()) == {10}
    again = order_desk_tasks(5, 3, train_temperature=0.7)  # deterministic prefixes
    assert [t.task_id for t in again[0]] == [t.task_id for t in train[:5]]
    assert [t.input["text"] for t in again[1]] == [t.input["text"] for t in held_out[:3]]
    assert again[0][0].input["temperature"] == 0.7
    with pytest.raises(UserError, match="size must be in"):
        order_desk_tasks(10_000, 1)


def test_backend_answers_from_the_rollouts_view() -> None:
    env = load_tau_retail()
    pending = next(k for k, o in env.data.items("orders") if o["status"] == "pending")
    delivered = next(k for k, o in env.data.items("orders") if o["status"] == "delivered")
    desk = OrderDesk(env.new_db())
    assert json.loads(desk.call("get_order_status", {"order_id": pending})) == {
        "order_id": pending,
        "status": "pending",
    }
    items = json.loads(desk.call("modify_order", {"order_id": pending.lower().lstrip("#")}))
    assert items["status"] == "pending" and items["items"] == [
        i["name"] for i in env.data.get("orders", pending)["items"]
    ]
    refused = json.loads(desk.call("cancel_order", {"order_id": delivered}))
    assert refused == {
        "order_id": delivered,
        "status": "delivered",
        "error": "only pending orders can be cancelled",
    }
    assert json.loads(desk.call("cancel_order", {"order_id": pending}))["status"] == "cancelled"
    assert desk.db.get("orders", pending)["status"] == "cancelled"  # written to this view only
    assert env.data.get("orders", pending)["status"] == "pending"
    assert (
        json.loads(OrderDesk(env.new_db()).call("get_order_status", {"order_id": pending}))["status"]
        == "pending"
    )
    assert desk.call("get_order_status", {"order_id": "#W0000000"}) == "Error: order not found"
    assert desk.call("get_order_status", {"id": pending}).startswith("Error: the tool takes exactly")
    assert desk.call("refund_order", {"order_id": pending}).startswith("Error: unknown tool")


def _turn(name: str, arguments: str | dict, reply: str) -> list[dict]:
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": name, "arguments": arguments}}],
        },
        {"role": "tool", "content": '{"status": "delivered"}'},
        {"role": "assistant", "content": reply},
    ]


def test_reward_parts() -> None:
    gold = ("get_order_status", {"order_id": "#W5442520"}, "delivered", ["pending", "processed", "cancelled"])
    right = score_tool_turn(
        _turn("get_order_status", '{"order_id": " w5442520."}', "It was DELIVERED."), *gold
    )
    assert (right.tool, right.arguments, right.reply, right.reward, right.success) == (1, 1, 1, 1, 1)
    wrong_tool = score_tool_turn(_turn("cancel_order", {"order_id": "#W5442520"}, "delivered"), *gold)
    assert (wrong_tool.tool, wrong_tool.arguments, wrong_tool.reply, wrong_tool.success) == (0, 1, 1, 0)
    assert wrong_tool.reward == pytest.approx(2 / 3)
    for bad_args in (
        '{"order_id": "#W5442521"}',
        '{"order_id": "#W5442520", "x": 1}',
        '{"order_id": ',
        "[1]",
    ):
        assert score_tool_turn(_turn("get_order_status", bad_args, "delivered"), *gold).arguments == 0.0
    hedged = score_tool_turn(
        _turn("get_order_status", {"order_id": "#W5442520"}, "pending or delivered"), *gold
    )
    assert hedged.reply == 0.0  # stating a contradicting status too does not count
    silent = score_tool_turn(_turn("get_order_status", {"order_id": "#W5442520"}, ""), *gold)
    assert silent.reply == 0.0
    no_call = score_tool_turn([{"role": "assistant", "content": "It is delivered."}], *gold)
    assert (no_call.tool, no_call.arguments, no_call.reply) == (0, 0, 1)
    weighted = score_tool_turn(_turn("cancel_order", "{}", "delivered"), *gold, weights=(0.0, 0.0, 1.0))
    assert weighted.reward == 1.0 and weighted.success == 0.0
    assert (
        normalize_arguments('{"order_id": "#w1"}') == {"order_id": "W1"} and normalize_arguments("x") is None
    )
    with pytest.raises(UserError, match="weights"):
        score_tool_turn([], *gold, weights=(1.0, 1.0))
    with pytest.raises(UserError, match="gold tool"):
        score_tool_turn([], "", {}, "delivered")


def test_staged_reward_counts_a_part_only_after_the_parts_before_it() -> None:
    gold = ("get_order_status", {"order_id": "#W5442520"}, "delivered", ["pending", "processed", "cancelled"])
    wrong_tool = _turn("cancel_order", {"order_id": "#W5442520"}, "It was delivered.")
    bad_args = _turn("get_order_status", {"order_id": "#W1"}, "It was delivered.")
    wrong_reply = _turn("get_order_status", {"order_id": "#W5442520"}, "It is pending.")
    right = _turn("get_order_status", {"order_id": "#W5442520"}, "It was delivered.")
    rewards = [
        score_tool_turn(t, *gold, staged=True).reward for t in (wrong_tool, bad_args, wrong_reply, right)
    ]
    assert rewards == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
    independent = score_tool_turn(wrong_tool, *gold)
    staged = score_tool_turn(wrong_tool, *gold, staged=True)
    assert independent.reward == pytest.approx(2 / 3)  # the wrong tool's reply states the status it returned
    assert independent.parts() == staged.parts()  # the parts and success do not change, only the scalar
    weighted = score_tool_turn(wrong_reply, *gold, weights=(1.0, 0.5, 0.5), staged=True)
    assert weighted.reward == pytest.approx(0.75)


def test_trl_reward_functions_report_each_part() -> None:
    completions = [
        _turn("get_order_status", {"order_id": "#W1"}, "delivered"),
        _turn("modify_order", {"order_id": "#W2"}, "It is pending."),
        "not a conversation",
    ]
    columns = {
        "gold_tool": ["get_order_status", "cancel_order", "get_order_status"],
        "gold_arguments": [{"order_id": "#W1"}, {"order_id": "#W2"}, {"order_id": "#W3"}],
        "gold_fact": ["delivered", "cancelled", "pending"],
        "prompts": ["ignored"] * 3,
    }
    funcs = {p: make_tool_turn_reward_func(p) for p in (*PARTS, "success")}
    assert {p: f(completions, **columns) for p, f in funcs.items()} == {
        "tool": [1.0, 0.0, None],
        "arguments": [1.0, 1.0, None],
        "reply": [1.0, 0.0, None],
        "success": [1.0, 0.0, None],
    }
    total = make_tool_turn_reward_func()
    assert total.__name__ == "tool_turn_reward" and funcs["tool"].__name__ == "tool_turn_tool"
    assert total(completions, **columns)[:2] == [1.0, pytest.approx(1 / 3)]
    with pytest.raises(UserError, match="gold_fact"):
        total(completions, gold_tool=columns["gold_tool"], gold_arguments=columns["gold_arguments"])
    with pytest.raises(UserError, match="unknown tool-turn reward part"):
        make_tool_turn_reward_func("style")


def test_order_bot_turn_through_the_gateway(tasks: tuple[list, list]) -> None:
    """Scripted policy: a right call, then a reply stating the tool's status; the rollout has two LLM calls,
    one tool span with the backend's answer, and a reward whose parts are in the store."""
    task = tasks[1][0]
    meta = task.metadata
    turns = [call(meta["gold_tool"], {"order_id": meta["order_id"]}), f"Your order is {meta['gold_fact']}."]
    with scripted_gateway(turns) as (store, upstream, gateway):
        with Runner(store, OrderDeskAgent(), gateway.url, poll_s=0.05) as runner:
            (rollout,) = enqueue_tasks(store, [task], max_attempts=1)
            (done,) = runner.run_until_done([rollout.rollout_id], timeout_s=60)
        assert done.state == RolloutState.succeeded, done.error
        llm = store.list_spans(rollout_id=done.rollout_id, kind=SpanKind.llm)
        (tool,) = store.list_spans(rollout_id=done.rollout_id, kind=SpanKind.tool)
        reward = store.final_reward(done.rollout_id)
    first, second = (r.body for r in upstream.requests)
    assert len(llm) == 2 and first["tool_choice"] == "required"
    assert [t["function"]["strict"] for t in first["tools"]] == [True] * 3  # the default
    assert "tool_choice" not in second and second["tools"] == first["tools"]
    assert second["messages"][-1]["role"] == "tool"
    assert json.loads(tool.attributes["output"])["status"] == meta["gold_fact"]
    assert reward.value == 1.0
    assert reward.metadata["parts"] == {"tool": 1.0, "arguments": 1.0, "reply": 1.0, "success": 1.0}


def _run_turn(task, turns: list, agent: OrderDeskAgent) -> tuple:
    """One rollout of ``agent`` on ``task`` against a scripted engine: (finished rollout, request bodies, reward)."""
    with scripted_gateway(turns) as (store, upstream, gateway):
        with Runner(store, agent, gateway.url, poll_s=0.05) as runner:
            (rollout,) = enqueue_tasks(store, [task], max_attempts=1)
            (done,) = runner.run_until_done([rollout.rollout_id], timeout_s=60)
        return done, [r.body for r in upstream.requests], store.final_reward(done.rollout_id)


def test_tools_are_strict_unless_asked_not_to_be(tasks: tuple[list, list]) -> None:
    meta = tasks[1][1].metadata
    turns = [call(meta["gold_tool"], {"order_id": meta["order_id"]}), "Sorry."]
    _, bodies, reward = _run_turn(tasks[1][1], turns, OrderDeskAgent(strict_tools=False))
    for body in bodies:
        assert [t["function"].get("strict") for t in body["tools"]] == [None] * 3
    assert reward.metadata["parts"] == {"tool": 1.0, "arguments": 1.0, "reply": 0.0, "success": 0.0}


def test_a_task_sets_the_call_and_the_reply_sampling_apart(tasks: tuple[list, list]) -> None:
    """``act_sampling`` / ``reply_sampling`` in the task input reach the engine per call (vLLM's ``min_p`` and
    ``top_k`` as body fields); a bad setting fails the rollout with a clear error instead of being sent."""
    from agentforge.agents.customer_service.order_bot import sampling_kwargs
    from agentforge.errors import ConfigError

    meta = tasks[1][0].metadata
    explore = {
        "act_sampling": {"temperature": 2.0, "min_p": 0.2, "seed": 7},
        "reply_sampling": {"temperature": 0.0},
    }
    task = tasks[1][0].model_copy(update={"input": {**tasks[1][0].input, **explore}})
    turns = [call(meta["gold_tool"], {"order_id": meta["order_id"]}), f"Your order is {meta['gold_fact']}."]
    done, (first, second), _ = _run_turn(task, turns, OrderDeskAgent())
    assert done.state == RolloutState.succeeded, done.error
    assert (first["temperature"], first["min_p"]) == (2.0, 0.2) and first["tool_choice"] == "required"
    assert first["seed"] == 7 and "seed" not in second  # a seeded call repeats its sample (the warm capture)
    assert second["temperature"] == 0.0 and "min_p" not in second
    assert sampling_kwargs({"top_k": 3, "top_p": 0.9}) == {"top_p": 0.9, "extra_body": {"top_k": 3}}
    for bad in ({"temprature": 1.0}, {"min_p": "high"}, {"top_k": True}, {"seed": 1.5}):
        with pytest.raises(ConfigError, match="sampling setting"):
            sampling_kwargs(bad)
