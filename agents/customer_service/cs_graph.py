"""The τ-retail customer-service agent as a LangGraph graph over an OpenAI-compatible client.

One ``graph.invoke`` serves **one customer turn**; the conversation lives in the graph's checkpointer
(``thread_id`` = the conversation), so the next turn sees everything said and done before::

    START → triage → retrieve → agent ⇄ tools → END

* **triage** (until an intent is known): one short LLM call, ``intent: …`` / ``order_id: …`` parsed with
  the scorer's parser (:func:`~.prompts.parse_retail_triage`); when the answer does not parse, a keyword
  guess; the order id also comes from the customer's own words (``#W`` + 7 digits).
* **retrieve**: the ``knowledge_k`` policy chunks nearest to the intent and message
  (:class:`~.knowledge.PolicyKnowledge`), fixed for the rest of the conversation.
* **agent**: the LLM with the system prompt (+ policy chunks + triage result), a worked example, the
  conversation (oldest turns dropped beyond ``max_history_chars``) and the intent's compact tool schemas.
* **tools**: every tool call runs against the rollout's own :class:`RetailDB`; malformed arguments
  become an error tool message (:func:`agentforge.toolcalls.tool_error_message`), outputs are
  shaped and cut to ``max_tool_chars`` (:func:`shape_tool_output`). After at most ``max_turn_calls`` agent calls the turn ends.

The system prompt, tool list and worked example stay the same for a whole conversation once the intent
is known, so consecutive calls extend each other token-exactly and the trainer merges them into one
trajectory (``trainers.samples``).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, TypedDict, cast

from agentforge.agents.customer_service.prompts import (
    RETAIL_TRIAGE_PROMPT,
    find_order_id,
    keyword_intent,
    parse_retail_triage,
    tools_for_intent,
    worked_example,
)
from agentforge.errors import ConfigError, MissingExtraError
from agentforge.runtime.context import bound_tool_output
from agentforge.toolcalls import MALFORMED_ARGUMENTS, tool_call_from_openai, tool_error_message
from agentforge.types import SpanKind

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

    from agentforge.agents.customer_service.knowledge import PolicyKnowledge
    from agentforge.agents.customer_service.tau_retail import RetailDB
    from agentforge.runtime.context import RolloutContext
    from agentforge.types import ToolCall

__all__ = [
    "CSState",
    "assistant_dict",
    "build_cs_graph",
    "fit_history",
    "offered_tools",
    "run_tool_calls",
    "shape_tool_output",
    "tool_span_recorder",
    "TRANSFER_TOOL",
]

#: Calling this tool hands the customer to a human: the conversation ends (as in τ-bench).
TRANSFER_TOOL = "transfer_to_human_agents"


class CSState(TypedDict, total=False):
    """State of one conversation (checkpointed between turns).

    Attributes:
        messages: the conversation as OpenAI chat messages (user, assistant, tool); grows by reducer.
        intent: the triaged intent (one of ``RETAIL_INTENTS``) or ``None``.
        order_id: the order id mentioned (``#W1234567``) or ``None``.
        triage_text: the model's raw triage answer.
        triage_source: ``"model"``, ``"keywords"`` or ``"none"``.
        knowledge: the retrieved policy chunks.
        turn_calls: agent LLM calls in the current turn (reset by each turn's input).
        llm_calls: LLM calls in the whole conversation (triage included).
        ended: the agent transferred the customer to a human.
    """

    messages: Annotated[list[dict[str, Any]], operator.add]
    intent: str | None
    order_id: str | None
    triage_text: str
    triage_source: str
    knowledge: list[str]
    turn_calls: int
    llm_calls: int
    ended: bool


def _messages(state: CSState) -> list[dict[str, Any]]:
    """``state["messages"]`` (a turn's input holds the customer's message; ``KeyError`` without it)."""
    if "messages" not in state:
        raise KeyError("messages")
    return state["messages"]


def fit_history(messages: Sequence[dict[str, Any]], max_chars: int) -> list[dict[str, Any]]:
    """The most recent whole turns (each starting at a user message) that fit in ``max_chars``.

    The current turn (from the last user message on) is always kept, so tool results never lose the
    call they answer.

    Args:
        messages: the conversation.
        max_chars: budget, characters of content and tool-call arguments.

    Returns:
        A suffix of ``messages`` that starts at a user message (or the whole list when it fits).
    """

    def size(m: dict[str, Any]) -> int:
        calls = m.get("tool_calls") or []
        return len(m.get("content") or "") + sum(len(c["function"]["arguments"]) + 20 for c in calls)

    sizes = [size(m) for m in messages]
    if sum(sizes) <= max_chars:
        return list(messages)
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    for start in starts:  # oldest first: the longest suffix that fits
        if sum(sizes[start:]) <= max_chars:
            return list(messages[start:])
    return list(messages[starts[-1] :]) if starts else list(messages)


def shape_tool_output(output: str, max_chars: int) -> str:
    """A tool output as the model sees it: JSON objects with their scalar fields first (so ``status``
    survives the cut), then cut to ``max_chars`` with a ``…[truncated N chars]`` marker.

    Args:
        output: the tool's output string (JSON or text).
        max_chars: budget, characters.

    Returns:
        The shaped, bounded text (the database and the reward never see it).
    """
    try:
        value = json.loads(output)
    except ValueError:
        value = None
    if isinstance(value, dict):
        scalars = {k: v for k, v in value.items() if not isinstance(v, dict | list)}
        output = json.dumps({**scalars, **{k: v for k, v in value.items() if k not in scalars}})
    return bound_tool_output(output, max_chars)


def assistant_dict(message: Any) -> dict[str, Any]:
    """An OpenAI SDK chat message as the assistant turn to send back in the history (tool calls included)."""
    entry: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        entry["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in message.tool_calls
        ]
    return entry


def offered_tools(schemas: Sequence[dict[str, Any]], strict: bool) -> list[dict[str, Any]]:
    """The tool schemas as sent, each marked ``"strict": true`` when ``strict`` (vLLM then pins a forced call's
    arguments to the schema, not only its frame and name)."""
    return [{**t, "function": {**t["function"], "strict": True}} if strict else dict(t) for t in schemas]


def run_tool_calls(
    message: dict[str, Any],
    call_tool: Callable[[str, Any], str],
    max_tool_chars: int,
    on_tool_call: Callable[[ToolCall, str], None] | None = None,
) -> list[dict[str, Any]]:
    """The tool messages answering every call of an assistant ``message``, in order.

    Args:
        message: the assistant message (OpenAI dict, :func:`assistant_dict`).
        call_tool: ``(name, parsed arguments) -> output`` (a desk's ``call``; must not raise for a bad call).
        max_tool_chars: longest output shown to the model (:func:`shape_tool_output`).
        on_tool_call: called with each parsed call and the content sent back (e.g. :func:`tool_span_recorder`).

    Returns:
        ``[{"role": "tool", "tool_call_id", "content"}]``; malformed arguments get
        :func:`~agentforge.toolcalls.tool_error_message` instead of a call.
    """
    answers = []
    for raw in message.get("tool_calls") or []:
        call = tool_call_from_openai(raw)
        if MALFORMED_ARGUMENTS in call.flags or call.parsed is None:
            answer = tool_error_message(call)
        else:
            content = shape_tool_output(call_tool(call.name, call.parsed), max_tool_chars)
            answer = {"role": "tool", "tool_call_id": call.id or "", "content": content}
        if on_tool_call is not None:
            on_tool_call(call, answer["content"])
        answers.append(answer)
    return answers


def tool_span_recorder(ctx: RolloutContext) -> Callable[[ToolCall, str], None]:
    """An ``on_tool_call`` that records one ``tool`` span per call on the rollout (``status="error"`` when the
    output starts with ``Error``), with the call's arguments, flags and output (bounded to 1,000 characters)."""

    def record(call: ToolCall, output: str) -> None:
        failed = output.startswith("Error")
        attributes = {
            "arguments": call.arguments,
            "output": bound_tool_output(output, 1000),
            "flags": call.flags,
        }
        ctx.emit_span(
            call.name,
            attributes,
            kind=SpanKind.tool,
            status="error" if failed else "ok",
            error=output[:200] if failed else None,
        )

    return record


def build_cs_graph(
    client: OpenAI,
    *,
    db: RetailDB,
    knowledge: PolicyKnowledge | None,
    system_prompt: str,
    model: str = "policy",
    max_turn_calls: int = 3,
    max_tokens: int = 96,
    temperature: float = 0.0,
    seed: int | None = 0,
    triage: bool = True,
    triage_max_tokens: int = 16,
    knowledge_k: int = 1,
    max_history_chars: int = 2000,
    max_tool_chars: int = 300,
    few_shot: bool = True,
    checkpointer: Any = None,
    on_tool_call: Callable[[ToolCall, str], None] | None = None,
) -> Any:
    """Build the compiled customer-service graph (see the module docstring).

    Args:
        client: an ``openai.OpenAI`` client (pointed at ``{gateway}/rollouts/{rollout_id}/v1`` by the caller).
        db: the rollout's private τ-retail database view (tools write only to it).
        knowledge: the policy index, or ``None`` to skip retrieval.
        system_prompt: the system prompt (the ``prompt:cs-system`` resource, see :func:`~.prompts.load_prompt`).
        model: the model name to request (``policy`` resolves to the active or pinned adapter version).
        max_turn_calls: agent LLM calls per customer turn, >= 1 (a tool round-trip costs one).
        max_tokens: completion budget per agent call, tokens (a tool call needs ≈ 40-70: vLLM's hermes
            parser returns a call only once its closing ``</tool_call>`` was generated).
        temperature: sampling temperature of the agent calls (0 = greedy; GRPO groups need > 0).
        seed: sampling seed sent to the engine (``None``: none).
        triage: run the triage LLM call (else intents come from keywords only).
        triage_max_tokens: completion budget of the triage call, tokens.
        knowledge_k: policy chunks put into the system prompt.
        max_history_chars: conversation budget per call, characters (≈ 3.5 characters per token).
        max_tool_chars: longest tool output shown to the model, characters.
        few_shot: put :func:`~.prompts.worked_example` before the conversation.
        checkpointer: a LangGraph checkpointer (default: a new ``InMemorySaver``); pass
            ``{"configurable": {"thread_id": ...}}`` to every ``invoke``.
        on_tool_call: called after each tool call with the parsed call and the full output (before
            shaping); e.g. to record tool spans. Exceptions it raises propagate.

    Returns:
        A compiled graph; ``graph.invoke({"messages": [{"role": "user", "content": text}], "turn_calls": 0},
        config)`` runs one turn and returns the :class:`CSState`.

    Raises:
        ConfigError: ``max_turn_calls < 1`` or a negative budget.
        MissingExtraError: ``langgraph`` is not installed.
    """
    if max_turn_calls < 1 or max_tokens < 1 or max_history_chars < 0 or max_tool_chars < 0:
        raise ConfigError(
            f"build_cs_graph(max_turn_calls={max_turn_calls}, max_tokens={max_tokens}, max_history_chars="
            f"{max_history_chars}, max_tool_chars={max_tool_chars}): calls and tokens must be >= 1, budgets >= 0"
        )
    try:
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.graph import END, START, StateGraph
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("langgraph", "agents", "the customer-service graph") from exc
    example = worked_example() if few_shot else []
    sampling: dict[str, Any] = {"temperature": temperature, **({"seed": seed} if seed is not None else {})}

    def last_user_text(state: CSState) -> str:
        users = [m for m in state.get("messages", []) if m.get("role") == "user"]
        return str(users[-1].get("content") or "") if users else ""

    def triage_node(state: CSState) -> dict[str, Any]:
        if state.get("intent"):
            return {}
        text, calls = last_user_text(state), state.get("llm_calls", 0)
        raw, intent, source = "", None, "none"
        order_id = state.get("order_id")
        if triage:
            out = client.chat.completions.create(
                model=model,
                messages=[
                    {"role": "system", "content": RETAIL_TRIAGE_PROMPT},
                    {"role": "user", "content": text},
                ],
                max_tokens=triage_max_tokens,
                **sampling,
            )
            calls += 1
            raw = out.choices[0].message.content or ""
            intent, parsed_order = parse_retail_triage(raw)
            order_id = order_id or parsed_order
            source = "model" if intent else source
        if intent is None and (intent := keyword_intent(text)):
            source = "keywords"
        return {
            "intent": intent,
            "order_id": order_id or find_order_id(text),
            "triage_text": raw,
            "triage_source": source,
            "llm_calls": calls,
        }

    def retrieve_node(state: CSState) -> dict[str, Any]:
        if knowledge is None or state.get("knowledge") or knowledge_k < 1:
            return {}
        query = f"{state.get('intent') or ''} {last_user_text(state)}".strip()
        return {"knowledge": knowledge.search(query, k=knowledge_k)}

    def system_message(state: CSState) -> dict[str, Any]:
        parts = [system_prompt]
        if chunks := state.get("knowledge"):
            parts.append("Policy:\n" + "\n".join(chunks))
        if state.get("intent") or state.get("order_id"):
            parts.append(
                f"Request: {state.get('intent') or 'unknown'}; order: {state.get('order_id') or 'unknown'}."
            )
        return {"role": "system", "content": "\n\n".join(parts)}

    def agent_node(state: CSState) -> dict[str, Any]:
        history = fit_history(state.get("messages", []), max_history_chars)
        out = client.chat.completions.create(
            model=model,
            messages=cast("list[ChatCompletionMessageParam]", [system_message(state), *example, *history]),
            tools=cast("list[ChatCompletionToolParam]", tools_for_intent(state.get("intent"))),
            max_tokens=max_tokens,
            **sampling,
        )
        reply = assistant_dict(out.choices[0].message)
        return {
            "messages": [reply],
            "turn_calls": state.get("turn_calls", 0) + 1,
            "llm_calls": state.get("llm_calls", 0) + 1,
        }

    def tools_node(state: CSState) -> dict[str, Any]:
        results, ended = [], False
        for raw in _messages(state)[-1].get("tool_calls") or []:
            call = tool_call_from_openai(raw)
            if MALFORMED_ARGUMENTS in call.flags or call.parsed is None:
                results.append(tool_error_message(call))
                if on_tool_call is not None:
                    on_tool_call(call, results[-1]["content"])
                continue
            output = db.call_tool(call.name, call.parsed)
            if on_tool_call is not None:
                on_tool_call(call, output)
            ended = ended or (call.name == TRANSFER_TOOL and not output.startswith("Error"))
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id or "",
                    "content": shape_tool_output(output, max_tool_chars),
                }
            )
        return {"messages": results, "ended": ended or state.get("ended", False)}

    def after_agent(state: CSState) -> str:
        return "tools" if _messages(state)[-1].get("tool_calls") else END

    def after_tools(state: CSState) -> str:
        return END if state.get("ended") or state.get("turn_calls", 0) >= max_turn_calls else "agent"

    graph = StateGraph(CSState)
    graph.add_node("triage", triage_node)
    graph.add_node("retrieve", retrieve_node)
    graph.add_node("agent", agent_node)
    graph.add_node("tools", tools_node)
    graph.add_edge(START, "triage")
    graph.add_edge("triage", "retrieve")
    graph.add_edge("retrieve", "agent")
    graph.add_conditional_edges("agent", after_agent, ["tools", END])
    graph.add_conditional_edges("tools", after_tools, ["agent", END])
    return graph.compile(checkpointer=checkpointer if checkpointer is not None else InMemorySaver())
