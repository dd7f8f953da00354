"""Handed case: a LangGraph fan-out whose subgraph shares the parent's state schema, run by the runner.

With ``ToolSpanCallback`` (``LangGraphAgent(record_tools=True)``) every tool call becomes a ``tool`` span,
and the graph's final state and its whole checkpoint history (parent and subgraph namespaces, with
pending writes) are exactly those of a run without it. A graph that raises (here LangGraph's own
``InvalidUpdateError`` from two subgraph branches writing a plain key) fails the rollout with the error.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Send
from runtime_helpers import gateway_env

from agentforge.runtime import LangGraphAgent, Runner, enqueue_tasks
from agentforge.testing import ScriptedToolCall, ScriptedTurn
from agentforge.types import AttemptState, RolloutState, SpanKind, Task

# The watchdog is not under test here: a timeout a loaded 2-core CI machine cannot trip (2.0 s did once,
# re-queueing a rollout that was still running, so its call reached the engine twice).
FAST = {"heartbeat_s": 0.2, "heartbeat_timeout_s": 30.0, "poll_s": 0.02}


def _last(_old: Any, new: Any) -> Any:
    return new


class State(TypedDict, total=False):
    topic: Annotated[str, _last]
    messages: Annotated[list[AnyMessage], operator.add]
    results: Annotated[list[str], operator.add]
    summary: str


class FragileState(TypedDict, total=False):
    topic: str  # no reducer: two parallel subgraph branches writing it is an error in LangGraph
    messages: Annotated[list[AnyMessage], operator.add]
    results: Annotated[list[str], operator.add]
    summary: str


@tool
def lookup(city: str) -> str:
    """Weather for a city."""
    return f"{city}: sunny"


@tool
def word_count(text: str) -> int:
    """Count words."""
    return len(text.split())


def make_builder(saver: InMemorySaver, schema: type) -> Callable[[Any, dict[str, str]], Any]:
    """``build_graph(client, resources)``: plan (LLM) → tools → fan-out to a shared-schema subgraph → final (LLM)."""

    def build(client: Any, resources: dict[str, str]) -> Any:
        model = resources.get("policy", "policy")

        def plan(state: dict[str, Any]) -> dict[str, Any]:
            out = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": state["topic"]}]
            )
            msg = out.choices[0].message
            calls = [
                {
                    "name": c.function.name,
                    "args": json.loads(c.function.arguments),
                    "id": c.id,
                    "type": "tool_call",
                }
                for c in msg.tool_calls or []
            ]
            return {"messages": [AIMessage(content=msg.content or "", tool_calls=calls)]}

        def note(state: dict[str, Any]) -> dict[str, Any]:
            observation = state["messages"][-1].content
            return {"results": [f"{observation} ({word_count.invoke({'text': observation})} words)"]}

        research = StateGraph(schema)
        research.add_node("note", note)
        research.add_edge(START, "note")
        research.add_edge("note", END)

        def fan_out(state: dict[str, Any]) -> list[Send]:
            tool_messages = [m for m in state["messages"] if isinstance(m, ToolMessage)]
            return [Send("research", {"topic": state["topic"], "messages": [m]}) for m in tool_messages]

        def final(state: dict[str, Any]) -> dict[str, Any]:
            text = "; ".join(sorted(state["results"]))
            out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
            return {"summary": out.choices[0].message.content or ""}

        graph = StateGraph(schema)
        graph.add_node("plan", plan)
        graph.add_node("tools", ToolNode([lookup], handle_tool_errors=False))
        graph.add_node("research", research.compile())
        graph.add_node("final", final)
        graph.add_edge(START, "plan")
        graph.add_edge("plan", "tools")
        graph.add_conditional_edges("tools", fan_out, ["research"])
        graph.add_edge("research", "final")
        graph.add_edge("final", END)
        return graph.compile(checkpointer=saver)

    return build


def _plan_turn() -> ScriptedTurn:
    return ScriptedTurn(
        "Checking.",
        tool_calls=[
            ScriptedToolCall("lookup", '{"city": "Paris"}', id="call_paris"),
            ScriptedToolCall("lookup", '{"city": "Oslo"}', id="call_oslo"),
        ],
    )


def _history(saver: InMemorySaver) -> list[Any]:
    """Every checkpoint of every namespace with its pending writes, minus ids that differ per run."""
    out = []
    for t in saver.list(None):
        ns = t.config["configurable"]["checkpoint_ns"].split(":")[0]
        meta = {**t.metadata, "parents": sorted(t.metadata.get("parents", {}))}
        writes = sorted((channel, repr(value)) for _task, channel, value in t.pending_writes or [])
        out.append(
            (ns, repr(sorted(meta.items())), repr(sorted(t.checkpoint["channel_values"].items())), writes)
        )
    return sorted(out)


def _run(tmp_path: Path, record_tools: bool) -> tuple[Any, list[Any], list[Any], Any]:
    saver, states = InMemorySaver(), []
    agent = LangGraphAgent(
        make_builder(saver, State),
        input_fn=lambda task: {"topic": task.input["topic"]},
        output_fn=lambda state: (
            states.append(state) or {"reward": 1.0 if state["summary"] == "All sunny." else 0.0}
        ),
        config={"configurable": {"thread_id": "t1"}},
        record_tools=record_tools,
        client_kwargs={"max_retries": 0},
    )
    with gateway_env(tmp_path, [_plan_turn(), "All sunny."]) as (store, gateway, upstream, _url):
        (rollout,) = enqueue_tasks(
            store, [Task(input={"topic": "weather"})], resources={"policy": "policy@v1"}
        )
        with Runner(store, agent, gateway.url, **FAST) as runner:
            (done,) = runner.run_until_done([rollout.rollout_id], timeout_s=30)
        assert done.state is RolloutState.succeeded, done.error
        assert store.final_reward(rollout.rollout_id).value == 1.0  # type: ignore[union-attr]
        tools = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.tool)
        llm = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm, valid_only=True)
        assert len(llm) == 2 and {s.llm.version for s in llm if s.llm} == {"policy@v1"}
    final = saver.get_tuple({"configurable": {"thread_id": "t1"}})
    assert final is not None
    return states[0], _history(saver), tools, final.checkpoint["channel_values"]


def test_tool_callback_records_tools_without_changing_state_or_checkpoints(tmp_path: Path) -> None:
    plain_state, plain_history, plain_tools, plain_values = _run(tmp_path / "plain", record_tools=False)
    traced_state, traced_history, traced_tools, traced_values = _run(tmp_path / "traced", record_tools=True)

    assert plain_tools == []
    assert traced_state == plain_state and traced_values == plain_values
    assert traced_history == plain_history
    assert len(plain_history) > 6  # parent and both subgraph namespaces were checkpointed
    assert {ns for ns, *_ in plain_history} == {"", "research"}
    # The shared schema's known quirk is preserved too: each branch hands back its input message.
    assert len(plain_state["messages"]) == 5 and sorted(plain_state["results"]) == [
        "Oslo: sunny (2 words)",
        "Paris: sunny (2 words)",
    ]

    by_name: dict[str, list[Any]] = {}
    for span in traced_tools:
        by_name.setdefault(span.name, []).append(span)
    assert sorted(by_name) == ["lookup", "word_count"] and all(len(v) == 2 for v in by_name.values())
    assert sorted(s.attributes["tool_call_id"] for s in by_name["lookup"]) == ["call_oslo", "call_paris"]
    assert sorted(s.attributes["output"] for s in by_name["lookup"]) == ["Oslo: sunny", "Paris: sunny"]
    assert all(s.status == "ok" and s.attempt_id and s.ended_at >= s.started_at for s in traced_tools)  # type: ignore[operator]


def test_graph_error_fails_the_rollout_with_the_error(tmp_path: Path) -> None:
    saver = InMemorySaver()
    agent = LangGraphAgent(
        make_builder(saver, FragileState),
        input_fn=lambda task: {"topic": task.input["topic"]},
        output_fn=lambda state: 1.0,
        config=lambda task, ctx: {"configurable": {"thread_id": ctx.rollout_id}},
        client_kwargs={"max_retries": 0},
    )
    with gateway_env(tmp_path, [_plan_turn()]) as (store, gateway, upstream, _url):
        (rollout,) = enqueue_tasks(store, [Task(input={"topic": "weather"})], max_attempts=1)
        with Runner(store, agent, gateway.url, **FAST) as runner:
            (done,) = runner.run_until_done([rollout.rollout_id], timeout_s=30)
        assert done.state is RolloutState.failed
        assert done.error is not None and done.error.startswith("InvalidUpdateError: At key 'topic'")
        (attempt,) = store.list_attempts(rollout.rollout_id)
        assert attempt.state is AttemptState.failed and attempt.error == done.error
        assert store.list_rewards(rollout.rollout_id) == []
        spans = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.tool)
        assert sorted(s.name for s in spans) == ["lookup", "lookup", "word_count", "word_count"]
        assert upstream.remaining == 0
