"""The τ-retail customer-service graph, simulated customer and episode runner, on scripted models behind the
real gateway: wiring, tools against the rollout's own database, memory across turns, malformed tool
arguments, the versioned system prompt, and the runtime integration (reward, spans, failed rollouts)."""

from __future__ import annotations

import json

import pytest
from cs_helpers import CANCEL, OLIVIA, call, scripted_customer, scripted_gateway
from openai import OpenAI

from agentforge.agents.customer_service.cs_graph import build_cs_graph, fit_history
from agentforge.agents.customer_service.episode import TauRetailAgent, run_tau_episode
from agentforge.agents.customer_service.prompts import (
    CS_PROMPT_NAME,
    DEFAULT_CS_SYSTEM_PROMPT,
    INTENT_TOOLS,
    load_prompt,
    parse_retail_triage,
    tools_for_intent,
)
from agentforge.agents.customer_service.tau_retail import load_tau_retail, load_tau_tasks
from agentforge.agents.customer_service.user_sim import STOP, UserSimulator
from agentforge.errors import ConfigError
from agentforge.runtime import Runner, enqueue_tasks
from agentforge.types import ResourceVersion, Rollout, RolloutState, SpanKind

CONFIG = {"configurable": {"thread_id": "conversation-1"}}


@pytest.fixture(scope="module")
def env():
    return load_tau_retail()


@pytest.fixture(scope="module")
def task0():
    task = load_tau_tasks("dev")[0]
    assert task.metadata["actions"] == [{"name": "cancel_pending_order", "kwargs": CANCEL}]
    return task


def _client(gateway, store) -> tuple[OpenAI, str]:
    rollout = store.enqueue_rollout(Rollout(agent="cs-test"))
    return OpenAI(
        base_url=gateway.rollout_base_url(rollout.rollout_id), api_key="x", max_retries=0
    ), rollout.rollout_id


def _turn(graph, text: str, config=CONFIG) -> dict:
    return graph.invoke({"messages": [{"role": "user", "content": text}], "turn_calls": 0}, config)


def test_turn_triages_calls_tool_on_the_rollout_db_and_answers(env) -> None:
    turns = [
        "intent: cancel\norder_id: #W5442520",
        call("find_user_id_by_name_zip", OLIVIA),
        "You are verified.",
    ]
    with scripted_gateway(turns) as (store, upstream, gateway):
        client, rollout_id = _client(gateway, store)
        db = env.new_db()
        graph = build_cs_graph(client, db=db, knowledge=None, system_prompt="SYSTEM-V1")
        state = _turn(graph, "I am Olivia Ito, zip 80218; please cancel #W5442520")
        assert (state["intent"], state["order_id"], state["triage_source"]) == (
            "cancel",
            "#W5442520",
            "model",
        )
        roles = [m["role"] for m in state["messages"]]
        assert roles == ["user", "assistant", "tool", "assistant"]
        assert state["messages"][2]["content"] == "olivia_ito_3591"
        assert state["messages"][-1]["content"] == "You are verified." and state["llm_calls"] == 3
        agent_request = upstream.requests[1].body
        assert agent_request["messages"][0]["content"].startswith("SYSTEM-V1")
        assert "Request: cancel; order: #W5442520." in agent_request["messages"][0]["content"]
        assert [t["function"]["name"] for t in agent_request["tools"]] == list(INTENT_TOOLS["cancel"])
        assert agent_request["max_tokens"] == 96 and agent_request["messages"][1]["content"].startswith(
            "Hi, I am Jane"
        )
        spans = store.list_spans(rollout_id=rollout_id, kind=SpanKind.llm)
        assert len(spans) == 3 and all(s.llm.prompt_token_ids and s.llm.completion_token_ids for s in spans)
        assert db.changed() == {}  # a read tool writes nothing


def test_write_tool_changes_only_this_rollouts_db_and_scores_one(env, task0) -> None:
    turns = ["intent: cancel", call("cancel_pending_order", CANCEL), "Cancelled."]
    with scripted_gateway(turns) as (store, _, gateway):
        client, _ = _client(gateway, store)
        mine, other = env.new_db(), env.new_db()
        graph = build_cs_graph(client, db=mine, knowledge=None, system_prompt="S")
        state = _turn(graph, "yes, cancel #W5442520, no longer needed")
    assert state["messages"][2]["content"].startswith(
        '{"order_id": "#W5442520", "user_id": "olivia_ito_3591", "status": "cancelled"'
    )
    assert mine.get("orders", "#W5442520")["status"] == "cancelled"
    assert other.get("orders", "#W5442520")["status"] == "pending" and other.db_hash() == env.data.base_hash
    from agentforge.agents.customer_service.rewards import tau_reward

    assert tau_reward(mine, task0, state["messages"]) == 1.0
    assert tau_reward(other, task0, state["messages"]) == 0.0


def test_conversation_memory_across_turns(env) -> None:
    turns = ["intent: return", "Please give me your email.", "Thanks, looking it up."]
    with scripted_gateway(turns) as (store, upstream, gateway):
        client, _ = _client(gateway, store)
        graph = build_cs_graph(client, db=env.new_db(), knowledge=None, system_prompt="S")
        _turn(graph, "I want to return a lamp")
        state = _turn(graph, "my email is a@b.c")
        second = upstream.requests[2].body["messages"]
        assert [m.get("content") for m in second[-3:]] == [
            "I want to return a lamp",
            "Please give me your email.",
            "my email is a@b.c",
        ]
        assert state["intent"] == "return" and len(upstream.requests) == 3  # triage ran once
        upstream.add("intent: cancel", "Hello.")
        fresh = _turn(graph, "hi", {"configurable": {"thread_id": "another"}})
        assert [m["content"] for m in fresh["messages"]] == ["hi", "Hello."]


def test_malformed_tool_arguments_become_an_error_message(env) -> None:
    turns = [
        "intent: cancel",
        call("get_order_details", '{"order_id": "#W54'),
        call("get_order_details", {"order_id": "#W5442520"}),
        "It is pending.",
    ]
    with scripted_gateway(turns) as (store, upstream, gateway):
        client, _ = _client(gateway, store)
        db = env.new_db()
        state = _turn(
            build_cs_graph(client, db=db, knowledge=None, system_prompt="S", max_turn_calls=3),
            "status of #W5442520?",
        )
    tool_messages = [m for m in state["messages"] if m["role"] == "tool"]
    assert tool_messages[0]["content"].startswith(
        "Error: the arguments of tool 'get_order_details' are not valid JSON"
    )
    assert tool_messages[1]["content"].startswith('{"order_id": "#W5442520"')
    assert state["messages"][-1]["content"] == "It is pending." and db.changed() == {}


def test_turn_stops_after_max_turn_calls_and_tool_output_is_bounded(env) -> None:
    turns = ["intent: cancel", call("get_order_details", {"order_id": "#W5442520"})]
    with scripted_gateway(turns) as (store, upstream, gateway):
        client, _ = _client(gateway, store)
        graph = build_cs_graph(
            client, db=env.new_db(), knowledge=None, system_prompt="S", max_turn_calls=1, max_tool_chars=120
        )
        state = _turn(graph, "order #W5442520")
    assert [m["role"] for m in state["messages"]] == ["user", "assistant", "tool"]
    assert len(state["messages"][-1]["content"]) <= 120 and "truncated" in state["messages"][-1]["content"]
    assert upstream.remaining == 0


def test_triage_falls_back_to_keywords_and_regex(env) -> None:
    assert parse_retail_triage("intent: Exchange\norder_id: W1234567") == ("exchange", "#W1234567")
    assert parse_retail_triage("I think refund") == (None, None)
    with scripted_gateway(["blah blah", "Sure."]) as (store, _, gateway):
        client, _ = _client(gateway, store)
        state = _turn(
            build_cs_graph(client, db=env.new_db(), knowledge=None, system_prompt="S"),
            "I'd like to exchange order W1234567",
        )
    assert (state["intent"], state["order_id"], state["triage_source"]) == (
        "exchange",
        "#W1234567",
        "keywords",
    )


def test_tools_and_history_budgets() -> None:
    assert {t["function"]["name"] for t in tools_for_intent(None)} == set(INTENT_TOOLS["info"])
    full = tools_for_intent("modify", compact=False)
    small = tools_for_intent("modify")
    assert len(json.dumps(small)) < len(json.dumps(full)) / 2
    assert [t["function"]["parameters"]["required"] for t in small] == [
        t["function"]["parameters"]["required"] for t in full
    ]
    msgs = [
        {"role": "user", "content": "a" * 50},
        {"role": "assistant", "content": "b" * 50},
        {"role": "user", "content": "c" * 50},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "x", "arguments": "d" * 30}}],
        },
        {"role": "tool", "tool_call_id": "1", "content": "e" * 40},
    ]
    assert fit_history(msgs, 10_000) == msgs
    assert fit_history(msgs, 150) == msgs[2:]
    assert fit_history(msgs, 10) == msgs[2:]  # the current turn is always kept whole
    with pytest.raises(ConfigError, match="max_turn_calls=0"):
        build_cs_graph(None, db=None, knowledge=None, system_prompt="", max_turn_calls=0)  # type: ignore[arg-type]


def test_episode_with_simulated_customer_scores_with_tau(env, task0) -> None:
    policy = [
        "intent: cancel",
        call("find_user_id_by_name_zip", OLIVIA),
        "Verified. Cancel #W5442520 for 'no longer needed'? (yes)",
        call("cancel_pending_order", CANCEL),
        "Done, it is cancelled.",
    ]
    customer = ["Hi, I'm Olivia Ito, zip 80218. Cancel order #W5442520 please.", "yes", f"Thanks! {STOP}"]
    with (
        scripted_gateway(policy) as (store, upstream, gateway),
        scripted_customer(customer) as (sim_up, sim_url),
    ):
        client, rollout_id = _client(gateway, store)
        sim = UserSimulator(OpenAI(base_url=sim_url, api_key="x", max_retries=0), "base")
        result = run_tau_episode(task0, client, sim, env=env, max_user_turns=4)
        assert (result.reward, result.db_match, result.stop_reason) == (1.0, True, "user_stop")
        assert (result.user_turns, result.agent_llm_calls, result.user_llm_calls) == (2, 5, 3)
        first = sim_up.requests[0].body["messages"]
        assert (
            first[-1]["content"]
            == f"Scenario: {task0.input['instruction']}\nAgent: Hi! How can I help you today?"
        )
        assert (
            first[1]["content"].startswith("Scenario: Your name is Jane Doe") and len(first) == 6
        )  # worked example
        assert sim_up.requests[1].body["messages"][-1]["content"].startswith("Agent: Verified.")
        # the customer's calls bypass the gateway: every span of the rollout is the agent's
        assert len(store.list_spans(rollout_id=rollout_id, kind=SpanKind.llm)) == 5
        assert store.list_spans(orphans=True) == []


def test_transfer_to_human_ends_the_episode(env, task0) -> None:
    policy = ["intent: info", call("transfer_to_human_agents", {"summary": "needs a human"})]
    with (
        scripted_gateway(policy) as (store, _, gateway),
        scripted_customer(["Help me"] * 3) as (sim_up, sim_url),
    ):
        client, _ = _client(gateway, store)
        sim = UserSimulator(OpenAI(base_url=sim_url, api_key="x", max_retries=0), "base")
        result = run_tau_episode(task0, client, sim, env=env)
    assert (result.stop_reason, result.user_turns, result.reward) == ("agent_transfer", 1, 0.0)
    assert result.messages[-1] == {
        "role": "tool",
        "tool_call_id": result.messages[-2]["tool_calls"][0]["id"],
        "content": "Transfer successful",
    }


def test_prompt_resource_versions_reach_the_next_rollout_without_restart(task0) -> None:
    policy = ["intent: cancel", "Hello from v1.", "intent: cancel", "Hello from v2."]
    with (
        scripted_gateway(policy) as (store, upstream, gateway),
        scripted_customer(["Hi", f"bye {STOP}"] * 2) as (_, sim_url),
    ):
        assert (
            load_prompt(store).version == 1
            and store.get_resource(CS_PROMPT_NAME).payload["template"] == DEFAULT_CS_SYSTEM_PROMPT
        )
        agent = TauRetailAgent(sim_url, use_knowledge=False)
        with Runner(store, agent, gateway.url, poll_s=0.05) as runner:
            (first,) = enqueue_tasks(store, [task0])
            runner.run_until_done([first.rollout_id], timeout_s=30)
            store.publish_resource(
                ResourceVersion(
                    name=CS_PROMPT_NAME, kind="prompt", payload={"template": "You are AcmeBot v2."}
                )
            )
            (second,) = enqueue_tasks(store, [task0])
            done = runner.run_until_done([second.rollout_id], timeout_s=30)
        assert done[0].state is RolloutState.succeeded
        systems = [r.body["messages"][0]["content"] for r in upstream.requests if r.body.get("tools")]
        assert systems[0].startswith(DEFAULT_CS_SYSTEM_PROMPT) and systems[1].startswith(
            "You are AcmeBot v2."
        )
        for rollout, version in ((first, 1), (second, 2)):
            reward = store.final_reward(rollout.rollout_id)
            assert (
                reward.name == "tau_reward"
                and reward.value == 0.0
                and reward.metadata["prompt_version"] == version
            )
            assert len(store.list_rewards(rollout.rollout_id)) == 1
            (episode,) = [
                s for s in store.list_spans(rollout_id=rollout.rollout_id) if s.name == "tau_episode"
            ]
            assert (
                episode.attributes["stop_reason"] == "user_stop"
                and episode.attributes["db_hash"] == reward.metadata["db_hash"]
            )


def test_context_overflow_fails_the_rollout_instead_of_scoring_it(task0) -> None:
    with (
        scripted_gateway(["intent: cancel"], max_model_len=40) as (store, _, gateway),
        scripted_customer(["Hi there"]) as (_, sim_url),
    ):
        with Runner(store, TauRetailAgent(sim_url, use_knowledge=False), gateway.url, poll_s=0.05) as runner:
            (rollout,) = enqueue_tasks(store, [task0], max_attempts=1)
            (done,) = runner.run_until_done([rollout.rollout_id], timeout_s=30)
        assert done.state is RolloutState.failed and "maximum context length" in (done.error or "")
        assert store.list_rewards(rollout.rollout_id) == []
        errors = [
            s
            for s in store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm)
            if s.status == "error"
        ]
        assert len(errors) == 1 and not errors[0].llm.trainable


def test_runtime_agent_records_tool_spans_and_the_tau_reward(env, task0) -> None:
    policy = [
        "intent: cancel",
        call("find_user_id_by_name_zip", OLIVIA),
        call("get_order_details", '{"order_id": '),
        "Confirm cancelling #W5442520 (no longer needed)?",
        call("cancel_pending_order", CANCEL),
        "Done.",
    ]
    customer = ["Olivia Ito, 80218: cancel #W5442520", "yes", STOP]
    with scripted_gateway(policy) as (store, _, gateway), scripted_customer(customer) as (_, sim_url):
        agent = TauRetailAgent(sim_url, use_knowledge=False, graph_options={"max_turn_calls": 3})
        with Runner(store, agent, gateway.url, poll_s=0.05) as runner:
            (rollout,) = enqueue_tasks(store, [task0])
            (done,) = runner.run_until_done([rollout.rollout_id], timeout_s=30)
        assert done.state is RolloutState.succeeded
        tools = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.tool)
        assert [(s.name, s.status) for s in tools] == [
            ("find_user_id_by_name_zip", "ok"),
            ("get_order_details", "error"),
            ("cancel_pending_order", "ok"),
        ]
        assert (
            tools[0].attributes["output"] == "olivia_ito_3591"
            and "malformed_arguments" in tools[1].attributes["flags"]
        )
        reward = store.final_reward(rollout.rollout_id)
        assert (reward.value, reward.metadata["db_match"], reward.attempt_id) == (
            1.0,
            True,
            tools[0].attempt_id,
        )
        assert (
            reward.metadata["db_hash"] != env.data.base_hash and env.new_db().db_hash() == env.data.base_hash
        )


def test_simulated_customer_endings_and_bounded_history() -> None:
    script = ["Hi, I'm Jane.", "Sure thing " * 40, f"Thanks! {STOP}", "###TRANSFER###", ""]
    with scripted_customer(script) as (upstream, url):
        sim = UserSimulator(OpenAI(base_url=url, api_key="x", max_retries=0), "base", max_history_chars=300)
        session = sim.session("You are Jane.")
        assert session.respond("Hello") == "Hi, I'm Jane." and not session.done
        session.respond("And?")
        assert session.respond("ok " * 200) == "Thanks!" and (session.done, session.stop_reason) == (
            True,
            "user_stop",
        )
        sent = upstream.requests[2].body["messages"]
        assert sent[0]["content"] == sim.guidelines and sent[1:5] == sim.example
        assert (
            sent[-1]["content"].startswith("Agent: ok") and len(sent) == 6
        )  # older turns dropped beyond 300 chars
        other = sim.session("x")
        assert other.respond("hi") == "" and other.stop_reason == "user_transfer"
        third = sim.session("y")
        assert third.respond("hi") == "" and third.stop_reason == "empty_reply"
    with pytest.raises(ConfigError, match="max_tokens=0"):
        UserSimulator(None, "base", max_tokens=0)  # type: ignore[arg-type]


def test_triage_with_choose_asks_the_engine_for_one_of_the_labels_and_parses_it() -> None:
    from agentforge.agents.customer_service.triage import build_triage_graph

    labels = ["card_arrival", "exchange_rate", "change_pin"]
    with scripted_gateway([" exchange_rate"]) as (store, upstream, gateway):
        client, rollout_id = _client(gateway, store)
        graph = build_triage_graph(client, labels=labels, prefill="Intent:", choose=True)
        assert graph.invoke({"message": "What rate do I get for euros?"})["label"] == "exchange_rate"
        (span,) = store.list_spans(rollout_id=rollout_id, kind=SpanKind.llm)
        request = span.llm.request
        assert request["structured_outputs"] == {"choice": [" card_arrival", " exchange_rate", " change_pin"]}
        assert request["continue_final_message"] is True and request["messages"][-1]["content"] == "Intent:"
