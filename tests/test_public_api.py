"""The public API is small and explicit, and importing it is cheap (STYLE 3, 4)."""

from __future__ import annotations

import subprocess
import sys

import agentforge


def test_exported_members_are_pinned() -> None:
    exported = set(agentforge.__all__)
    assert exported == {
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
    }
    for name in exported:
        assert hasattr(agentforge, name), name


def test_import_starts_nothing_heavy() -> None:
    code = (
        "import sys, threading, agentforge, agentforge.cli;"
        "heavy = [m for m in ('torch', 'vllm', 'chromadb', 'transformers', 'trl', 'peft') if m in sys.modules];"
        "assert not heavy, heavy;"
        "assert threading.active_count() == 1, threading.enumerate()"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
