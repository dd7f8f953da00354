"""The rollout runtime: run agents on queued rollouts, with retries, timeouts, heartbeats and shutdown.

* :class:`Runner` — N workers (threads or spawned processes) claim queued rollouts from the store, run
  the agent with a :class:`RolloutContext` whose ``base_url`` is ``{gateway}/rollouts/{rollout_id}/v1``,
  record rewards and attempt outcomes, and re-queue rollouts of dead workers (heartbeat watchdog).
* :func:`enqueue_tasks`, :func:`wait_for_rollouts`, :func:`evaluate_tasks` (:func:`task_scores`: per task), :func:`load_tasks` — enqueue G
  rollouts per task, wait for them, measure a version's mean reward, read tasks from JSONL.
* :class:`LangGraphAgent` — run an unchanged LangGraph graph as an agent;
  :class:`~agentforge.runtime.callbacks.ToolSpanCallback` (import it from
  ``agentforge.runtime.callbacks``; needs ``langchain-core``) records its tool calls as spans.
* :class:`EngineEndpoint` — the engine's own address (``ctx.engine``), for calls never recorded (a simulated
  customer).
* :func:`bound_tool_output` — cut a tool's output to a budget with a ``…[truncated N chars]`` marker.

Importing this package starts nothing and imports neither ``openai`` nor LangChain.
"""

from agentforge.runtime.agents import Agent, LangGraphAgent, Scorer, build_agent, load_object
from agentforge.runtime.context import AttemptStore, EngineEndpoint, RolloutContext, bound_tool_output
from agentforge.runtime.runner import Runner
from agentforge.runtime.tasks import enqueue_tasks, evaluate_tasks, load_tasks, task_scores, wait_for_rollouts
from agentforge.runtime.worker import describe_error, give_back

__all__ = [
    "Agent",
    "Scorer",
    "Runner",
    "RolloutContext",
    "AttemptStore",
    "EngineEndpoint",
    "LangGraphAgent",
    "enqueue_tasks",
    "wait_for_rollouts",
    "evaluate_tasks",
    "task_scores",
    "load_tasks",
    "give_back",
    "bound_tool_output",
    "describe_error",
    "build_agent",
    "load_object",
]
