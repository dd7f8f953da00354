"""The service desk (eight tools, policy questions, two-call turns): its tasks, its backend, the turn reward, and
the service bot's turn through the real gateway with a scripted policy."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from cs_helpers import call, scripted_gateway

from agentforge.agents.customer_service.datasets import load_bitext
from agentforge.agents.customer_service.rewards.service_turn import score_service_turn
from agentforge.agents.customer_service.service_bot import ServiceDeskAgent
from agentforge.agents.customer_service.service_desk import (
    POLICY_FACTS,
    SERVICE_TOOLS,
    ServiceDesk,
    invoice_for_order,
    reference,
    service_desk_tasks,
)
from agentforge.agents.customer_service.tau_retail import load_tau_retail
from agentforge.errors import UserError
from agentforge.runtime import Runner, enqueue_tasks
from agentforge.testing import ScriptedToolCall, ScriptedTurn
from agentforge.types import RolloutState, SpanKind


@pytest.fixture(scope="module")
def tasks() -> tuple[list, list]:
    return service_desk_tasks()


def test_tasks_cover_every_kind_with_a_held_out_set_of_150(tasks: tuple[list, list]) -> None:
    train, held_out = tasks
    assert len(held_out) >= 150 and len(train) > 1000
    assert not {t.task_id for t in train} & {t.task_id for t in held_out}
    assert {t.metadata["split"] for t in held_out} == {"test"}
    kinds = Counter(t.metadata["kind"] for t in held_out)
    assert len(kinds) == 11 and kinds["two_calls"] > 0
    assert {t.metadata["kind"] for t in held_out[:11]} == set(kinds)  # round-robin: every prefix is mixed
    assert service_desk_tasks(20, 11) == (train[:20], held_out[:11])  # deterministic
    tools = {c["name"] for t in train for c in t.metadata["gold_calls"]}
    assert tools == {t["function"]["name"] for t in SERVICE_TOOLS} and len(tools) == 8
    # some turns need no tool, some two
    assert Counter(len(t.metadata["gold_calls"]) for t in held_out).keys() == {0, 1, 2}


def test_every_gold_fact_is_what_the_gold_calls_answer(tasks: tuple[list, list]) -> None:
    env = load_tau_retail()
    bitext = {t.metadata["index"]: t for t in load_bitext()}
    for task in tasks[0][:200] + tasks[1]:
        meta = task.metadata
        if not meta["gold_calls"]:
            assert meta["gold_facts"] == [POLICY_FACTS[meta["intent"]]]
            assert task.input["text"] == bitext[meta["index"]].input["text"]
            continue
        db = env.new_db()
        facts = []
        for gold in meta["gold_calls"]:
            out = json.loads(ServiceDesk(db, meta["user_id"]).call(gold["name"], gold["arguments"]))
            facts.append(out.get("reference") or out.get("amount") or out.get("sent_to") or out["status"])
            assert next(iter(gold["arguments"].values())).upper() in task.input["text"].upper()
        assert facts == meta["gold_facts"]


def test_backend_answers_invoices_and_accounts_from_the_database() -> None:
    env = load_tau_retail()
    order = env.data.get("orders", "#W2611340")
    user = env.data.get("users", order["user_id"])
    desk = ServiceDesk(env.new_db(), order["user_id"])
    invoice = invoice_for_order("#W2611340")
    assert invoice == "INV2611340"
    assert json.loads(desk.call("get_invoice", {"invoice_id": "#inv2611340"})) == {
        "invoice_id": invoice,
        "order_id": "#W2611340",
        "amount": "536.65",
        "status": "paid",
    }
    assert json.loads(desk.call("send_invoice", {"invoice_id": invoice}))["sent_to"] == user["email"]
    closed = json.loads(desk.call("close_account", {"account_type": "Gold"}))
    assert closed["reference"] == reference("close_account", order["user_id"], "gold")
    assert closed["reference"] != json.loads(desk.call("edit_account", {"account_type": "gold"}))["reference"]
    assert desk.call("get_invoice", {"invoice_id": "INV0000000"}) == "Error: invoice not found"
    assert desk.call("get_invoice", {"invoice_id": "W2611340"}) == "Error: invoice not found"
    assert desk.call("send_invoice", {"order_id": invoice}).startswith("Error: the tool takes exactly")
    assert (
        ServiceDesk(env.new_db()).call("edit_account", {"account_type": "gold"})
        == "Error: no signed-in customer"
    )
    assert desk.call("refund", {"x": 1}).startswith("Error: unknown tool")
    assert json.loads(desk.call("get_order_status", {"order_id": "#W2611340"}))["status"] == "processed"


def _assistant(*calls: tuple[str, dict], text: str = "") -> dict:
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [{"function": {"name": n, "arguments": json.dumps(a)}} for n, a in calls],
    }


def test_reward_parts_for_no_one_and_two_calls() -> None:
    gold = [{"name": "get_invoice", "arguments": {"invoice_id": "INV1"}}]
    reply = {"role": "assistant", "content": "It was 12.50."}
    right = score_service_turn([_assistant(("get_invoice", {"invoice_id": "inv1"})), reply], gold, ["12.50"])
    assert right.parts() == {"tool": 1.0, "arguments": 1.0, "reply": 1.0, "success": 1.0}
    confused = score_service_turn(
        [_assistant(("send_invoice", {"invoice_id": "INV1"})), reply], gold, ["12.50"]
    )
    assert confused.parts() == {"tool": 0.0, "arguments": 0.0, "reply": 1.0, "success": 0.0}
    # a policy question: a tool call is wrong, an answer from the knowledge base is right
    policy = [{"role": "assistant", "content": "Refunds take 5 to 7 business days."}]
    assert score_service_turn(policy, [], ["5 to 7 business days"]).success == 1.0
    called = [_assistant(("get_order_status", {"order_id": "#W1"})), *policy]
    assert score_service_turn(called, [], ["5 to 7 business days"]).parts()["tool"] == 0.0
    # two calls: both needed, in any order, and both facts
    two = [{"name": "get_order_status", "arguments": {"order_id": "#W1"}}, *gold]
    made = _assistant(("get_invoice", {"invoice_id": "INV1"}), ("get_order_status", {"order_id": "W1"}))
    both = {"role": "assistant", "content": "Order is delivered; invoice 12.50."}
    assert score_service_turn([made, both], two, ["delivered", "12.50"], ["pending"]).success == 1.0
    one_fact = {"role": "assistant", "content": "Order is delivered."}
    assert score_service_turn([made, one_fact], two, ["delivered", "12.50"]).parts()["reply"] == 0.0
    only_one = [_assistant(("get_order_status", {"order_id": "W1"})), both]
    assert score_service_turn(only_one, two, ["delivered", "12.50"]).parts()["tool"] == 0.0
    staged = score_service_turn([_assistant(("x", {})), reply], gold, ["12.50"], staged=True)
    assert staged.reward == 0.0 and staged.reply == 1.0
    with pytest.raises(UserError, match="needs facts"):
        score_service_turn([], gold, [])
    with pytest.raises(UserError, match="needs facts"):
        score_service_turn([], [{"name": "", "arguments": {}}], ["x"])


def _run(task, turns: list) -> tuple:
    with scripted_gateway(turns) as (store, upstream, gateway):
        with Runner(store, ServiceDeskAgent(), gateway.url, poll_s=0.05) as runner:
            (rollout,) = enqueue_tasks(store, [task], max_attempts=1)
            (done,) = runner.run_until_done([rollout.rollout_id], timeout_s=60)
        tools = store.list_spans(rollout_id=done.rollout_id, kind=SpanKind.tool)
        return done, [r.body for r in upstream.requests], store.final_reward(done.rollout_id), tools


def test_service_bot_calls_tools_in_a_loop_then_replies(tasks: tuple[list, list]) -> None:
    """Scripted two-call turn: both calls in one message, then the reply; every call offers all eight tools
    with ``tool_choice="auto"``; the tool spans hold the backend's answers; the reward is in the store."""
    task = next(t for t in tasks[1] if t.metadata["kind"] == "two_calls")
    meta = task.metadata
    both = ScriptedTurn(
        tool_calls=[ScriptedToolCall(c["name"], json.dumps(c["arguments"])) for c in meta["gold_calls"]]
    )
    done, bodies, reward, tools = _run(task, [both, "Done: " + " and ".join(meta["gold_facts"]) + "."])
    assert done.state == RolloutState.succeeded, done.error
    assert [b["tool_choice"] for b in bodies] == ["auto", "auto"]
    assert all(len(b["tools"]) == 8 for b in bodies) and bodies[1]["messages"][-1]["role"] == "tool"
    assert [s.name for s in tools] == [c["name"] for c in meta["gold_calls"]]
    assert reward.metadata["parts"] == {"tool": 1.0, "arguments": 1.0, "reply": 1.0, "success": 1.0}


def test_service_bot_answers_a_policy_question_without_a_tool(tasks: tuple[list, list]) -> None:
    task = next(t for t in tasks[1] if t.metadata["intent"] == "check_refund_policy")
    done, bodies, reward, tools = _run(task, ["Refunds reach you in 5 to 7 business days."])
    assert len(bodies) == 1 and not tools and reward.value == 1.0


def test_service_bot_must_reply_after_its_tool_rounds(tasks: tuple[list, list]) -> None:
    """A policy that calls a tool every time is cut off: the third call is sent with ``tool_choice="none"``."""
    task = tasks[1][0]
    gold = task.metadata["gold_calls"][0]
    turns = [call(gold["name"], gold["arguments"]), call(gold["name"], gold["arguments"]), "ok"]
    done, bodies, reward, tools = _run(task, turns)
    assert [b["tool_choice"] for b in bodies] == ["auto", "auto", "none"]
    assert len(tools) == 2 and reward.metadata["parts"]["tool"] == 0.0  # two calls where one was gold
    forced = task.model_copy(update={"input": {**task.input, "first_tool_choice": "required"}})
    _, bodies, _, _ = _run(forced, [call(gold["name"], gold["arguments"]), "ok"])
    assert [b["tool_choice"] for b in bodies] == ["required", "auto"]
