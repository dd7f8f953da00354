"""agentforge: agents that improve themselves while they serve users.

Nothing heavy happens at import: no thread starts, and torch, vLLM and chromadb are imported only by the
components that need them.
"""

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
)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "AgentForgeError",
    "UserError",
    "RunError",
    "ConfigError",
    "MissingExtraError",
    "NotFoundError",
    "ServingError",
    "StoreError",
    "UpstreamError",
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
]
