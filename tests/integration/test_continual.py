"""Continual training behind the live customer-service app (examples/app/service.py, used unchanged).

Fast tests (scripted engine): the reward's arithmetic; a rated conversation's opening is read from its
first LLM span as stored; used conversations are marked and never offered again; ``stop()`` ends the wait.

The must-show (real vLLM, ``vllm`` + ``slow``): feedback arrives in the running app → the trainer re-runs
the opening as a group, takes a GRPO step and hot-swaps a new version → the app's next reply (same app
object, never restarted) is served by that version (``span.llm.version``).

Late feedback (``examples/continual_order_app.py``'s simulated customers, the order bot behind the app): a
rating sent after the conversation closed and after its version was replaced attaches to the conversation's
reply span and the version that produced it; the gate's live rewards count it for that version. Once on the
scripted engine (fast), once on real vLLM with a real adapter swap.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from example_app import load_example, load_service
from fastapi.testclient import TestClient

from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.stores.sql import SQLStore
from agentforge.testing import ScriptedToolCall, ScriptedTurn, ScriptedUpstream
from agentforge.trainers.continual import (
    APP_AGENT,
    ContinualTrainer,
    FeedbackSource,
    Stopped,
    feedback_reward,
    word_f1,
)
from agentforge.trainers.rollouts import RolloutSource
from agentforge.types import SpanKind

service = load_service("agentforge_continual_app_service")


def _conversation(client: TestClient, text: str, score: float) -> str:
    started = client.post("/sessions", json={"user": "u-1"}).json()
    sid, owner = started["session_id"], {"Authorization": f"Bearer {started['session_token']}"}
    resp = client.post(f"/sessions/{sid}/messages", json={"content": text}, headers=owner)
    assert resp.status_code == 200, resp.text
    assert client.post(f"/sessions/{sid}/feedback", json={"score": score}, headers=owner).status_code == 200
    assert client.post(f"/sessions/{sid}/close", headers=owner).status_code == 200
    return sid


def test_feedback_reward_follows_the_rating() -> None:
    assert APP_AGENT == service.AGENT
    assert word_f1("Your order is delivered", "your order is delivered.") == 1.0
    assert word_f1("hello", "goodbye") == 0.0
    assert word_f1("", "") == 1.0 and word_f1("", "x") == 0.0
    sim = word_f1("order delivered", "Your order W1001 is delivered.")
    assert 0 < sim < 1
    assert feedback_reward("order delivered", "Your order W1001 is delivered.", 1) == pytest.approx(sim)
    assert feedback_reward("order delivered", "Your order W1001 is delivered.", -1) == pytest.approx(1 - sim)
    assert feedback_reward("anything", "else", 0) is None


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[tuple[SQLStore, ScriptedUpstream, TestClient]]:
    upstream = ScriptedUpstream()
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    engine = upstream.serve()
    try:
        with (
            GatewayServer(store, upstream.router(base_url=f"{engine.url}/v1")) as gateway,
            TestClient(service.create_app(gateway.url, store)) as client,
        ):
            yield store, upstream, client
    finally:
        engine.stop()
        store.close()


def test_openings_of_rated_conversations_are_read_marked_and_offered_once(scripted) -> None:
    store, upstream, client = scripted
    call = ScriptedToolCall("get_order_status", json.dumps({"order_id": "W1001"}), id="call_w1001")
    upstream.add(ScriptedTurn(tool_calls=[call]), "Your order W1001 is delivered.")
    rated = _conversation(client, "Where is my order W1001?", 1)
    upstream.add("Hello!")
    started = client.post("/sessions", json={}).json()  # unrated: never offered
    sid = started["session_id"]
    client.post(
        f"/sessions/{sid}/messages",
        json={"content": "hi"},
        headers={"Authorization": f"Bearer {started['session_token']}"},
    )

    stop = threading.Event()
    inner = RolloutSource(store, {}, 2, lambda: "policy@v0", agent="continual:replay")
    source = FeedbackSource(store, inner, 1, stop, poll_s=0.05)
    [opening] = source.pending()
    first = min(
        store.list_spans(rollout_id=rated, kind=SpanKind.llm), key=lambda s: s.sequence or 0
    )  # the opening is exactly the first call's request
    assert opening.rollout.rollout_id == rated and opening.feedback == 1.0
    assert opening.request == first.llm.request
    assert opening.request["messages"][0]["role"] == "system"
    assert opening.request["messages"][-1] == {"role": "user", "content": "Where is my order W1001?"}
    assert opening.reference == 'get_order_status({"order_id": "W1001"})'
    task = opening.task("policy", 1.0)
    assert task.input["tools"] and task.input["feedback"] == 1.0 and task.input["model"] == "policy"

    source._mark(opening.rollout, step=0)
    assert store.get_rollout(rated).metadata["continual"] == {"run": source.run_id, "step": 0}
    assert store.get_rollout(rated).metadata["user"] == "u-1"  # the app's metadata is kept
    assert source.pending() == []
    stop.set()
    with pytest.raises(Stopped):
        source(["slot-0"] * 2)


# --- the must-show, on real vLLM ------------------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.slow
def test_feedback_trains_a_step_and_the_running_app_gets_the_new_version(vllm_tool_server, tmp_path) -> None:
    from agentforge.config import default_model_dir
    from agentforge.serving.publisher import HotSwapPublisher
    from agentforge.trainers.grpo_config import TrainConfig

    alias = f"policy-{tmp_path.name[-6:]}".replace("_", "")
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    router = ModelRouter()
    swapper = HotSwapper(vllm_tool_server, router, alias, drain_timeout_s=60)
    base = swapper.register_base()
    config = TrainConfig(
        output_dir=str(tmp_path / "run"),
        num_generations=4,
        tasks_per_step=1,
        alias=alias,
        learning_rate=5e-4,
        lora_r=8,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        max_completion_length=48,
        rollout_timeout_s=300,
        wait_timeout_s=600,
    )
    with GatewayServer(store, router) as gateway:
        app = service.create_app(gateway.url, store, model=alias)
        with TestClient(app) as client:
            trainer = ContinualTrainer(
                default_model_dir(), store, gateway.url, config, HotSwapPublisher(swapper, store), poll_s=0.5
            )
            result: dict = {}
            thread = threading.Thread(target=lambda: result.update(trainer.run(max_steps=1)), daemon=True)
            thread.start()
            rated = _conversation(client, "Where is my order W1001?", 1)
            thread.join(timeout=900)
            assert not thread.is_alive(), "the continual trainer did not finish its step"

            assert result["steps"] == 1 and result["conversations"] == [rated]
            assert result["versions"] == [f"{alias}@v1"] and router.alias(alias) == f"{alias}@v1"
            assert store.get_rollout(rated).metadata["continual"]["step"] == 0
            replays = [r for r in store.list_rollouts(agent="continual:replay")]
            assert len(replays) == 4 and {r.resources[alias] for r in replays} == {base}
            assert all(store.final_reward(r.rollout_id) is not None for r in replays)
            assert "loss" in result["history"][0]

            # The same app object, never restarted, now answers with the new version.
            after = _conversation(client, "Can I return my order W1002?", 1)
            spans = store.list_spans(rollout_id=after, kind=SpanKind.llm)
            assert spans and {s.llm.version for s in spans} == {f"{alias}@v1"}
            assert {s.llm.version for s in store.list_spans(rollout_id=rated, kind=SpanKind.llm)} == {base}
            # The rated conversation trained on is used up; the one rated after the step waits for the next.
            assert [o.rollout.rollout_id for o in trainer.source.pending()] == [after]
    store.close()


def test_example_has_a_help() -> None:
    import subprocess

    example = Path(__file__).resolve().parents[2] / "examples" / "continual_app.py"
    out = subprocess.run([sys.executable, str(example), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--group-size" in out.stdout and "ContinualTrainer" in out.stdout


# --- late feedback on the order bot (examples/continual_order_app.py) -----------------------------------


def _order_app(gateway_url: str, store: SQLStore, alias: str) -> TestClient:
    order_agent = load_example("app/order_agent.py", "agentforge_test_order_agent")
    app = service.create_app(
        gateway_url, store, model=alias, agent=order_agent, prompt_name=order_agent.PROMPT_NAME
    )
    return TestClient(app)


def _late_ratings_follow_the_replying_version(store, router, alias, client, replace) -> list[dict]:
    """Customer 1 is answered by the live version, ``replace()`` serves a new one, customer 2 is answered by it;
    both ratings arrive after their conversations closed and after the replacement. Returns the records."""
    from agentforge.agents.customer_service.order_desk import order_desk_tasks
    from agentforge.serving.promoter import LiveRewards

    app = load_example("continual_order_app.py", "agentforge_test_continual_order_app")
    _, held_out = order_desk_tasks(0, 2)
    since, first = __import__("time").time() - 1, router.alias(alias)
    sim = app.Customers(client, held_out, 0.0, 0.0, lambda: router.alias(alias))
    sim.converse(held_out[0])
    second = replace()
    assert second != first and router.alias(alias) == second
    sim.converse(held_out[1])
    assert all(store.get_rollout(r["session"]).state.value == "succeeded" for r in sim.records)  # finished
    sim._rate_due(until_all=True)
    app._attach(store, sim.records)
    for record, version in zip(sim.records, (first, second), strict=True):
        spans = store.list_spans(rollout_id=record["session"], kind=SpanKind.llm)
        assert len(spans) == 2 and {s.llm.version for s in spans} == {version}  # act + reply, one version
        reward = store.final_reward(record["session"])
        assert reward is not None and reward.value == record["rating"] and reward.source == "user_feedback"
        assert reward.span_id == spans[-1].span_id == record["reward_span"]  # the reply call
        assert record["replied_by"] == version and record["live_at_rating"] == second
        assert record["rated_at"] > record["replied_at"] and record["rollout_state"] == "succeeded"
    assert sim.records[0]["live_at_rating"] != sim.records[0]["replied_by"]  # its version was replaced
    live = LiveRewards(store, alias).collect(since)  # what the canary and the rollback watch read
    assert live == {first: [sim.records[0]["rating"]], second: [sim.records[1]["rating"]]}
    return sim.records


def test_late_order_ratings_attach_to_the_replying_version_scripted(tmp_path: Path) -> None:
    from agentforge.agents.customer_service.order_desk import order_desk_tasks

    _, held_out = order_desk_tasks(0, 2)
    upstream = ScriptedUpstream()
    for i, task in enumerate(held_out):  # customer 1: the right call and fact; customer 2: the wrong tool
        tool = task.metadata["gold_tool"] if i == 0 else "modify_order"
        call = ScriptedToolCall(tool, json.dumps({"order_id": task.metadata["order_id"]}), id=f"call_{i}")
        upstream.add(ScriptedTurn(tool_calls=[call]), f"Your order is {task.metadata['gold_fact']}.")
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    engine = upstream.serve()
    router = upstream.router(base_url=f"{engine.url}/v1")

    def replace() -> str:
        router.register("policy@v2", upstream.upstream(f"{engine.url}/v1"))
        router.set_alias("policy", "policy@v2")
        return "policy@v2"

    try:
        with GatewayServer(store, router) as gateway, _order_app(gateway.url, store, "policy") as client:
            records = _late_ratings_follow_the_replying_version(store, router, "policy", client, replace)
            inner = RolloutSource(store, {}, 2, lambda: "policy@v2", agent="continual:replay")
            openings = FeedbackSource(store, inner, 1, threading.Event()).pending()
            assert [o.task("policy", 1.0).input["tool_choice"] for o in openings] == ["required"] * 2
    finally:
        engine.stop()
        store.close()
    assert [r["rating"] for r in records] == [1.0, -1.0]  # the simulated customers judge by the gold
    assert records[1]["parts"]["tool"] == 0.0 and records[0]["parts"]["success"] == 1.0


@pytest.mark.vllm
@pytest.mark.slow
def test_late_order_ratings_attach_to_the_replying_version_vllm(
    vllm_tool_server, letter_adapters, unique_alias, tmp_path
) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    router = ModelRouter()
    swapper = HotSwapper(vllm_tool_server, router, unique_alias, drain_timeout_s=60)
    swapper.register_base()
    try:
        with GatewayServer(store, router) as gateway, _order_app(gateway.url, store, unique_alias) as client:
            replace = lambda: swapper.swap(letter_adapters["A"])  # noqa: E731
            records = _late_ratings_follow_the_replying_version(store, router, unique_alias, client, replace)
        assert {r["status"] for r in records} == {200}
    finally:
        swapper.reset_to_base()
        store.close()


def test_call_feedback_reward_scores_the_rerun_call_against_the_rated_one() -> None:
    app = load_example("continual_order_app.py", "agentforge_test_continual_order_app")
    ref = 'get_order_status({"order_id": "#W2378156"})'
    assert app.call_feedback_reward('get_order_status({"order_id": "w2378156"})', ref, 1.0) == 1.0
    assert app.call_feedback_reward('cancel_order({"order_id": "#W2378156"})', ref, 1.0) == 0.5
    assert app.call_feedback_reward('cancel_order({"order_id": "#W1"})', ref, -1.0) == 1.0
    assert app.call_feedback_reward("Hello there", ref, 1.0) == 0.0
    assert app.call_feedback_reward(ref, ref, 0.0) is None
