"""Serving: the policy engine (vLLM process or embedded transformers + peft) and adapter hot-swap.

Importing this package starts nothing and imports neither torch nor vLLM.
"""

from agentforge.serving.adapters import VLLM_LORA_RANKS, AdapterInfo, check_adapter, read_adapter
from agentforge.serving.base import PolicyServer
from agentforge.serving.embedded import EmbeddedServer
from agentforge.serving.hotswap import Canary, CanaryResult, ChatCanary, HotSwapper, PromptCanary
from agentforge.serving.vllm import VLLMServer, tool_chat_template

__all__ = [
    "PolicyServer",
    "VLLMServer",
    "EmbeddedServer",
    "HotSwapper",
    "Canary",
    "CanaryResult",
    "ChatCanary",
    "PromptCanary",
    "AdapterInfo",
    "read_adapter",
    "check_adapter",
    "VLLM_LORA_RANKS",
    "tool_chat_template",
]
