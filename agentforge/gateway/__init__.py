"""The tracing gateway: an OpenAI-compatible proxy that records every LLM call token-exactly.

Public API (imported lazily, so ``import agentforge.gateway.router`` stays light):

* :func:`create_gateway` — the FastAPI app; :class:`GatewayServer` / :func:`serve_gateway` — run it on a port.
* :class:`ModelRouter`, :class:`Upstream` — aliases → versions → engines.
* :func:`tool_error_messages`, :func:`malformed_tool_calls`, :func:`parse_tool_arguments` — tool-call helpers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentforge.gateway.router import ModelRouter, Upstream

if TYPE_CHECKING:
    from agentforge.gateway.app import create_gateway
    from agentforge.gateway.server import GatewayServer, serve_gateway
    from agentforge.toolcalls import malformed_tool_calls, parse_tool_arguments, tool_error_messages

__all__ = [
    "ModelRouter",
    "Upstream",
    "create_gateway",
    "GatewayServer",
    "serve_gateway",
    "tool_error_messages",
    "malformed_tool_calls",
    "parse_tool_arguments",
]

_LAZY = {
    "create_gateway": "agentforge.gateway.app",
    "GatewayServer": "agentforge.gateway.server",
    "serve_gateway": "agentforge.gateway.server",
    "tool_error_messages": "agentforge.toolcalls",
    "malformed_tool_calls": "agentforge.toolcalls",
    "parse_tool_arguments": "agentforge.toolcalls",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentforge.gateway' has no attribute {name!r}")
