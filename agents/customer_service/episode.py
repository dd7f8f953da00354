"""τ-retail episodes: the customer-service graph talks with a simulated customer, then the τ scorer decides.

* :func:`run_tau_episode` — one conversation on a fresh private database, scored with
  :func:`agentforge.agents.customer_service.rewards.tau_reward_details` (database hash vs. the gold replay, required outputs).
* :class:`TauRetailAgent` — the same as a runtime agent ``agent(task, ctx)``: reads the versioned system
  prompt at the start of the rollout, sends the policy's calls through the rollout's gateway URL, the
  customer's calls to a separate endpoint (see :mod:`.user_sim`), records a ``tau_episode`` span and the
  reward (``name="tau_reward"``, ``final=True``, with ``db_hash``/``db_match``/``missing_outputs``).

Episode flow (as τ-bench): the agent's greeting ``"Hi! How can I help you today?"`` goes to the customer;
then, per turn, the customer's message runs one graph turn and the agent's last text goes back. It ends
when the customer writes an ending token, the agent transfers to a human, or after ``max_user_turns``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentforge.agents.customer_service.cs_graph import build_cs_graph
from agentforge.agents.customer_service.prompts import CS_PROMPT_NAME, DEFAULT_CS_SYSTEM_PROMPT, load_prompt
from agentforge.agents.customer_service.rewards.tau import tau_reward_details
from agentforge.agents.customer_service.user_sim import DEFAULT_USER_GUIDELINES, UserSimulator
from agentforge.errors import ConfigError, UserError
from agentforge.runtime.context import bound_tool_output
from agentforge.types import SpanKind, Task, ToolCall

if TYPE_CHECKING:
    from openai import OpenAI

    from agentforge.agents.customer_service.knowledge import PolicyKnowledge
    from agentforge.agents.customer_service.tau_retail import TauRetail
    from agentforge.runtime.context import RolloutContext

__all__ = ["GREETING", "EpisodeResult", "run_tau_episode", "TauRetailAgent", "policy_knowledge"]

#: The agent's first message, shown to the simulated customer (τ-bench's greeting).
GREETING = "Hi! How can I help you today?"


@dataclass
class EpisodeResult:
    """One finished τ episode.

    Attributes:
        task_id: the task.
        messages: the conversation as the agent kept it (user, assistant and tool messages; no system
            prompt, no worked example).
        db_hash: hash of the rollout's database afterwards (``RetailDB.db_hash``).
        reward: 1.0 or 0.0 by the τ scorer.
        db_match: the database equals the gold replay.
        missing_outputs: required strings the agent never said.
        stop_reason: ``user_stop``, ``user_transfer``, ``out_of_scope``, ``empty_reply``, ``agent_transfer``
            or ``max_turns``.
        user_turns: customer messages the agent answered.
        agent_llm_calls: LLM calls of the agent (triage included).
        user_llm_calls: LLM calls of the simulated customer.
        intent: the triaged intent, if any.
        seconds: wall-clock duration.
    """

    task_id: str
    messages: list[dict[str, Any]]
    db_hash: str
    reward: float
    db_match: bool
    missing_outputs: list[str] = field(default_factory=list)
    stop_reason: str = ""
    user_turns: int = 0
    agent_llm_calls: int = 0
    user_llm_calls: int = 0
    intent: str | None = None
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """Everything but the messages, JSON-ready (for spans and logs)."""
        return {k: v for k, v in self.__dict__.items() if k != "messages"}


def run_tau_episode(
    task: Task,
    client: OpenAI,
    user_sim: UserSimulator,
    *,
    env: TauRetail | None = None,
    system_prompt: str = DEFAULT_CS_SYSTEM_PROMPT,
    knowledge: PolicyKnowledge | None = None,
    model: str = "policy",
    max_user_turns: int = 4,
    thread_id: str | None = None,
    graph_options: dict[str, Any] | None = None,
) -> EpisodeResult:
    """Run one τ-retail conversation (agent graph + simulated customer) and score it.

    Args:
        task: a τ-retail task (``input["instruction"]`` for the customer; gold in ``metadata``).
        client: the agent's OpenAI client (a rollout's gateway URL to record the calls).
        user_sim: the simulated customer (on its own endpoint; see :mod:`.user_sim`).
        env: the τ-retail environment (default :func:`~.tau_retail.load_tau_retail`).
        system_prompt: the agent's system prompt.
        knowledge: the policy index for retrieval, or ``None``.
        model: the model the agent requests.
        max_user_turns: customer messages answered at most, >= 1.
        thread_id: the checkpointer thread (default: the task id).
        graph_options: more :func:`~.cs_graph.build_cs_graph` keyword arguments (``max_tokens``, ...).

    Returns:
        The :class:`EpisodeResult`.

    Raises:
        ConfigError: ``max_user_turns < 1``.
        UserError: the task has no ``instruction``.
        openai.APIError: an LLM call failed (e.g. a prompt over the context limit); the runtime marks the
            rollout failed, never scored 0.
    """
    if max_user_turns < 1:
        raise ConfigError(f"run_tau_episode(max_user_turns={max_user_turns}): need at least 1 turn")
    instruction = task.input.get("instruction")
    if not isinstance(instruction, str) or not instruction:
        raise UserError(f"task {task.task_id} has no input['instruction'] for the simulated customer")
    if env is None:
        from agentforge.agents.customer_service.tau_retail import load_tau_retail

        env = load_tau_retail()
    started, db = time.perf_counter(), env.new_db()
    graph = build_cs_graph(
        client, db=db, knowledge=knowledge, system_prompt=system_prompt, model=model, **(graph_options or {})
    )
    config = {"configurable": {"thread_id": thread_id or task.task_id}, "recursion_limit": 50}
    session = user_sim.session(instruction)
    state: dict[str, Any] = {"messages": []}
    agent_text, stop_reason, turns = GREETING, "max_turns", 0
    while turns < max_user_turns:
        customer = session.respond(agent_text)
        if session.done:  # an ending token ends the conversation; the agent does not answer it
            stop_reason = session.stop_reason or stop_reason
            break
        state = graph.invoke({"messages": [{"role": "user", "content": customer}], "turn_calls": 0}, config)
        turns += 1
        said = [m for m in state["messages"] if m["role"] == "assistant" and m.get("content")]
        agent_text = str(said[-1]["content"]) if said and state["messages"][-1]["role"] == "assistant" else ""
        if state.get("ended"):
            stop_reason = "agent_transfer"
            break
    messages = list(state.get("messages", []))
    details = tau_reward_details(db, task, messages, env=env.data)
    return EpisodeResult(
        task_id=task.task_id,
        messages=messages,
        db_hash=details.agent_hash,
        reward=details.reward,
        db_match=details.db_match,
        missing_outputs=list(details.missing_outputs),
        stop_reason=stop_reason,
        user_turns=turns,
        agent_llm_calls=int(state.get("llm_calls", 0)),
        user_llm_calls=session.calls,
        intent=state.get("intent"),
        seconds=round(time.perf_counter() - started, 3),
    )


_KNOWLEDGE: dict[str, PolicyKnowledge] = {}
_KNOWLEDGE_LOCK = threading.Lock()


def policy_knowledge(env: TauRetail) -> PolicyKnowledge:
    """The in-memory policy index of ``env.wiki``, built once per process and data folder (≈ 3-10 s the
    first time, mostly loading the embedding model).

    Raises:
        EmbeddingModelMissingError: the offline embedding model package is missing.
    """
    from agentforge.agents.customer_service.knowledge import PolicyKnowledge

    key = str(env.data_dir)
    with _KNOWLEDGE_LOCK:
        if key not in _KNOWLEDGE:
            _KNOWLEDGE[key] = PolicyKnowledge.from_policy(
                env.wiki, collection="tau-retail-policy", max_chars=450
            )
        return _KNOWLEDGE[key]


class TauRetailAgent:
    """A runtime agent (``agent(task, ctx)``) that runs one τ-retail episode per rollout.

    Per attempt: read ``prompt:cs-system`` (the version pinned in ``ctx.resources``, else the active
    one; the default is published as version 1 if absent), run :func:`run_tau_episode` with the agent's
    client on ``ctx.base_url`` and the customer on ``user_base_url``, record one ``tool`` span per tool
    call (name, arguments, output cut to 1,000 characters; ``status="error"`` for ``Error: ...``
    outputs), a ``tau_episode`` custom span (the :meth:`EpisodeResult.summary` plus the prompt version)
    and the τ reward. Returns the
    summary without a ``reward`` key, so the runner adds no second reward.

    Picklable (for process-mode runners): the policy index is built lazily per process.

    Args:
        user_base_url: OpenAI base URL of the customer's model (the engine, not the rollout URL).
        user_model: the customer's model name there.
        user_api_key: API key for that endpoint.
        prompt_name: the system-prompt resource.
        default_prompt: its version 1, published when absent.
        use_knowledge: retrieve policy chunks (needs the offline embedding model).
        max_user_turns: customer messages per episode.
        user_max_tokens: completion budget per customer message, tokens.
        user_guidelines: the customer's guidelines.
        graph_options: more :func:`~.cs_graph.build_cs_graph` keyword arguments.
        data_dir: the ``tau_retail/v1`` folder (default: the shared data folder).
    """

    def __init__(
        self,
        user_base_url: str,
        user_model: str = "base",
        *,
        user_api_key: str = "agentforge-no-key",
        prompt_name: str = CS_PROMPT_NAME,
        default_prompt: str = DEFAULT_CS_SYSTEM_PROMPT,
        use_knowledge: bool = True,
        max_user_turns: int = 4,
        user_max_tokens: int = 48,
        user_guidelines: str = DEFAULT_USER_GUIDELINES,
        graph_options: dict[str, Any] | None = None,
        data_dir: str | Path | None = None,
    ) -> None:
        self.user_base_url, self.user_model, self.user_api_key = user_base_url, user_model, user_api_key
        self.prompt_name, self.default_prompt, self.use_knowledge = prompt_name, default_prompt, use_knowledge
        self.max_user_turns, self.user_max_tokens, self.user_guidelines = (
            max_user_turns,
            user_max_tokens,
            user_guidelines,
        )
        self.graph_options, self.data_dir = dict(graph_options or {}), data_dir

    def __call__(self, task: Task, ctx: RolloutContext) -> dict[str, Any]:
        """Run and score one episode for the attempt (see the class docstring).

        Raises:
            openai.APIError: an LLM call failed (the runner marks the attempt failed).
        """
        from openai import OpenAI

        from agentforge.agents.customer_service.tau_retail import load_tau_retail

        env = load_tau_retail(self.data_dir)
        prompt = load_prompt(
            ctx.store, self.prompt_name, self.default_prompt, ctx.resources.get(self.prompt_name)
        )
        knowledge = policy_knowledge(env) if self.use_knowledge else None

        def record_tool(call: ToolCall, output: str) -> None:
            attributes = {
                "arguments": call.arguments,
                "output": bound_tool_output(output, 1000),
                "output_chars": len(output),
                "tool_call_id": call.id,
                "flags": call.flags,
            }
            failed = output.startswith("Error")
            ctx.emit_span(
                call.name,
                attributes,
                kind=SpanKind.tool,
                status="error" if failed else "ok",
                error=output[:200] if failed else None,
            )

        client = ctx.openai_client(max_retries=0)
        user_client = OpenAI(
            base_url=self.user_base_url, api_key=self.user_api_key, max_retries=0, timeout=ctx.timeout_s
        )
        user_sim = UserSimulator(
            user_client, self.user_model, guidelines=self.user_guidelines, max_tokens=self.user_max_tokens
        )
        try:
            result = run_tau_episode(
                task,
                client,
                user_sim,
                env=env,
                system_prompt=prompt.payload["template"],
                knowledge=knowledge,
                model=ctx.model,
                max_user_turns=self.max_user_turns,
                thread_id=ctx.attempt_id or ctx.rollout_id,
                graph_options={**self.graph_options, "on_tool_call": record_tool},
            )
        finally:
            client.close()
            user_client.close()
        summary = {**result.summary(), "prompt_name": self.prompt_name, "prompt_version": prompt.version}
        ctx.emit_span("tau_episode", summary, kind=SpanKind.custom)
        ctx.emit_reward(
            result.reward,
            name="tau_reward",
            final=True,
            db_hash=result.db_hash,
            db_match=result.db_match,
            missing_outputs=result.missing_outputs,
            prompt_version=prompt.version,
        )
        return {k: v for k, v in summary.items() if k != "reward"}  # the reward is recorded above, once
