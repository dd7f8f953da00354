"""agentforge: agents that improve themselves while they serve users.

The front door: everything a user needs is importable from here::

    from agentforge import LocalStack, LightningTrainer, TrainConfig, HotSwapPublisher, open_store

* the objects that cross boundaries (:class:`Task`, :class:`Rollout`, :class:`Span`, :class:`Reward`,
  :class:`ResourceVersion`, :class:`Version` with its one ``parse``/``str``, …), :func:`rollout_base_url`
  (``{gateway}/rollouts/{rollout_id}/v1``) and the error tree (:class:`AgentForgeError` → :class:`UserError` /
  :class:`RunError`);
* agent-side recording: :func:`emit_reward`, :func:`emit_span`;
* running agents: :class:`Runner`, :func:`enqueue_tasks`, :func:`wait_for_rollouts`, :func:`evaluate_tasks`,
  :func:`task_scores`;
* the store: :func:`open_store` (SQLite, PostgreSQL or a store server, by URL), the :class:`TraceStore` port;
* serving: :class:`LocalStack` (engine + hot-swapper + gateway + runners), :class:`HotSwapper`,
  :func:`prepare_default_model`;
* the registry: prompts (:func:`publish_prompt`, :func:`get_prompt` for the active or a pinned version,
  :func:`rollback_prompt` to activate any version) and adapters (:class:`AdapterPublisher` with its
  ``publish``/``current``, :class:`HotSwapPublisher`, :class:`StorePublisher`, :func:`rollback_adapter`);
* gated promotion: :class:`GatedPublisher` (an adapter becomes the default only through :class:`EvalGate`, a
  :class:`CanaryRule` on live traffic, and is rolled back by :class:`RollbackRule`), :class:`PromptPromoter` (the
  same canary and rollback for prompt versions), :func:`list_decisions`;
* training: :class:`TrainConfig` + :class:`LightningTrainer` (online GRPO), :class:`ContinualTrainer` (from
  user feedback), :class:`ReplaySFTConfig` + :func:`run_replay_sft` and :func:`run_offline_grpo` (stored
  traces picked by a :class:`TraceFilter`), :func:`optimize_prompt`, :func:`plot_reward_curves`.

Nothing heavy happens at import: no thread starts, and only the types and errors are imported eagerly.
Every other name is loaded on first access (PEP 562), so torch, vLLM and chromadb are imported only by the
components that need them.
"""

import importlib as _importlib
import typing as _typing

from agentforge.errors import (
    AgentForgeError,
    ConfigError,
    MissingExtraError,
    NotFoundError,
    RunError,
    ServingError,
    StoreError,
    UpstreamError,
    UserError,
)
from agentforge.types import (
    Attempt,
    AttemptState,
    LLMCall,
    ResourceVersion,
    Reward,
    Rollout,
    RolloutState,
    Span,
    SpanKind,
    Task,
    ToolCall,
    Version,
    rollout_base_url,
)

if _typing.TYPE_CHECKING:
    from agentforge.gate import CanaryRule, EvalGate, RollbackRule, list_decisions
    from agentforge.model import prepare_default_model
    from agentforge.open import open_store
    from agentforge.ports import AdapterPublisher, TraceStore
    from agentforge.prompts import get_prompt, publish_prompt, rollback_prompt
    from agentforge.runtime import Runner, enqueue_tasks, evaluate_tasks, task_scores, wait_for_rollouts
    from agentforge.serving.hotswap import HotSwapper
    from agentforge.serving.promoter import GatedPublisher
    from agentforge.serving.publisher import HotSwapPublisher
    from agentforge.stack import LocalStack
    from agentforge.tracing import emit_reward, emit_span
    from agentforge.trainers.continual import ContinualTrainer
    from agentforge.trainers.grpo_config import TrainConfig
    from agentforge.trainers.grpo_trainer import LightningTrainer
    from agentforge.trainers.prompt_opt import optimize_prompt
    from agentforge.trainers.prompt_promote import PromptPromoter
    from agentforge.trainers.publish import StorePublisher, rollback_adapter
    from agentforge.trainers.replay.grpo import run_offline_grpo
    from agentforge.trainers.replay.select import TraceFilter
    from agentforge.trainers.replay.sft_config import ReplaySFTConfig
    from agentforge.trainers.replay.sft_trainer import run_replay_sft
    from agentforge.trainers.report import plot_reward_curves

__version__ = "0.1.0"

#: Lazily loaded names → the module that defines them (imported on first access).
_LAZY = {
    "emit_reward": "agentforge.tracing",
    "emit_span": "agentforge.tracing",
    "Runner": "agentforge.runtime",
    "enqueue_tasks": "agentforge.runtime",
    "wait_for_rollouts": "agentforge.runtime",
    "evaluate_tasks": "agentforge.runtime",
    "task_scores": "agentforge.runtime",
    "open_store": "agentforge.open",
    "TraceStore": "agentforge.ports",
    "LocalStack": "agentforge.stack",
    "HotSwapper": "agentforge.serving.hotswap",
    "prepare_default_model": "agentforge.model",
    "publish_prompt": "agentforge.prompts",
    "get_prompt": "agentforge.prompts",
    "rollback_prompt": "agentforge.prompts",
    "AdapterPublisher": "agentforge.ports",
    "HotSwapPublisher": "agentforge.serving.publisher",
    "GatedPublisher": "agentforge.serving.promoter",
    "EvalGate": "agentforge.gate",
    "CanaryRule": "agentforge.gate",
    "RollbackRule": "agentforge.gate",
    "list_decisions": "agentforge.gate",
    "PromptPromoter": "agentforge.trainers.prompt_promote",
    "StorePublisher": "agentforge.trainers.publish",
    "rollback_adapter": "agentforge.trainers.publish",
    "TrainConfig": "agentforge.trainers.grpo_config",
    "LightningTrainer": "agentforge.trainers.grpo_trainer",
    "ContinualTrainer": "agentforge.trainers.continual",
    "ReplaySFTConfig": "agentforge.trainers.replay.sft_config",
    "run_replay_sft": "agentforge.trainers.replay.sft_trainer",
    "run_offline_grpo": "agentforge.trainers.replay.grpo",
    "TraceFilter": "agentforge.trainers.replay.select",
    "optimize_prompt": "agentforge.trainers.prompt_opt",
    "plot_reward_curves": "agentforge.trainers.report",
}

__all__ = [
    "__version__",
    # errors
    "AgentForgeError",
    "UserError",
    "RunError",
    "ConfigError",
    "MissingExtraError",
    "NotFoundError",
    "ServingError",
    "StoreError",
    "UpstreamError",
    # types
    "Task",
    "Rollout",
    "RolloutState",
    "Attempt",
    "AttemptState",
    "Span",
    "SpanKind",
    "LLMCall",
    "ToolCall",
    "Reward",
    "ResourceVersion",
    "Version",
    "rollout_base_url",
    # recording, running, storing, serving
    "emit_reward",
    "emit_span",
    "Runner",
    "enqueue_tasks",
    "wait_for_rollouts",
    "evaluate_tasks",
    "task_scores",
    "open_store",
    "TraceStore",
    "LocalStack",
    "HotSwapper",
    "prepare_default_model",
    # the registry: prompts and adapters
    "publish_prompt",
    "get_prompt",
    "rollback_prompt",
    "AdapterPublisher",
    "HotSwapPublisher",
    "StorePublisher",
    "rollback_adapter",
    # gated promotion: eval gate, traffic canary, automatic rollback, the decision log
    "GatedPublisher",
    "EvalGate",
    "CanaryRule",
    "RollbackRule",
    "list_decisions",
    "PromptPromoter",
    # training
    "TrainConfig",
    "LightningTrainer",
    "ContinualTrainer",
    "ReplaySFTConfig",
    "run_replay_sft",
    "run_offline_grpo",
    "TraceFilter",
    "optimize_prompt",
    "plot_reward_curves",
]


def __getattr__(name: str) -> _typing.Any:
    """Load a front-door name on first access (PEP 562) and keep it, so the next access is a plain lookup.

    Raises:
        AttributeError: ``name`` is not part of the public API.
        MissingExtraError: the name needs an optional dependency that is not installed (the message names
            the ``pip install "agentforge[...]"`` to run).
    """
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentforge' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, lazily loaded ones included (for ``dir()`` and tab completion)."""
    return sorted(set(globals()) | set(_LAZY))
