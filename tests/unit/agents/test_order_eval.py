"""What an order-bot evaluation reports (agents/customer_service/order_eval.py): parts, tools, collapse, splits."""

from __future__ import annotations

import pytest
from cs_helpers import call, scripted_gateway

from agentforge.agents.customer_service.order_bot import OrderDeskAgent
from agentforge.agents.customer_service.order_desk import order_desk_tasks
from agentforge.agents.customer_service.order_eval import collapse_ratio, summarise_turns
from agentforge.errors import UserError
from agentforge.runtime import Runner, enqueue_tasks
from agentforge.trainers.samples import build_trajectories


def test_collapse_ratio_is_the_favourite_tools_count_over_its_gold_count() -> None:
    gold = {"get_order_status": 10, "cancel_order": 10, "modify_order": 10}
    assert collapse_ratio({"get_order_status": 21, "cancel_order": 9}, gold) == 2.1
    assert collapse_ratio(gold, gold) == 1.0
    assert collapse_ratio({"(none)": 3}, gold) == float("inf")
    assert collapse_ratio({}, gold) == 0.0


def test_summary_of_a_right_and_a_wrong_turn_through_the_gateway() -> None:
    """Two scripted turns: a right one on a track_order task, then the status tool on a cancel_order task (wrong
    tool, right argument, a reply with the gold status); the summary has each part's mean, the tools chosen against
    the gold tools, per-task success in order and the share of one-trajectory rollouts."""
    _, held_out = order_desk_tasks(0, 2)
    track, cancel = held_out
    assert (track.metadata["gold_tool"], cancel.metadata["gold_tool"]) == ("get_order_status", "cancel_order")
    turns = []
    for task in held_out:
        meta = task.metadata
        turns += [call("get_order_status", {"order_id": meta["order_id"]}), f"It is {meta['gold_fact']}."]
    with scripted_gateway(turns) as (store, _upstream, gateway):
        with Runner(store, OrderDeskAgent(), gateway.url, poll_s=0.05) as runner:
            done = []
            for task in held_out:  # one after the other: the script is consumed in order
                (rollout,) = enqueue_tasks(store, [task], max_attempts=1)
                done += runner.run_until_done([rollout.rollout_id], timeout_s=60)
        summary = summarise_turns(store, done, lambda spans: len(build_trajectories(spans)))
        singles = [
            len(build_trajectories(store.list_spans(rollout_id=r.rollout_id, kind="llm"))) == 1 for r in done
        ]
        assert "one_trajectory_share" not in summarise_turns(store, done)
        with pytest.raises(UserError, match="at least one rollout"):
            summarise_turns(store, [])
    assert summary["n"] == 2 and summary["scores"] == [1.0, 0.0]
    assert summary["parts"] == {"tool": 0.5, "arguments": 1.0, "reply": 1.0, "success": 0.5}
    assert summary["tools_chosen"] == {"get_order_status": 2}
    assert summary["tools_gold"] == {"get_order_status": 1, "cancel_order": 1}
    assert summary["collapse_ratio"] == 2.0
    assert summary["llm_calls"] == {2: 2} and summary["one_trajectory_share"] == sum(singles) / 2
