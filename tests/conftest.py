"""Shared pytest configuration. Fixtures live in plugin modules next to this file, one per component."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "support"))

# Tests never reach a real hosted LLM by accident.
os.environ.pop("OPENAI_API_KEY", None)
# Nor export to a developer's OpenTelemetry collector: a store exports only where a test sets OTEL_* itself.
for _name in [n for n in os.environ if n.startswith("OTEL_")]:
    os.environ.pop(_name)
os.environ.setdefault("AGENTFORGE_HOME", str(Path.home() / ".cache" / "agentforge"))

# ``fixtures_guard``: an autouse guard fails any test that reaches a real LLM endpoint its markers do not
# allow (hosted APIs and vLLM: only ``vllm`` tests; the embedded engine: ``slow`` or ``vllm`` tests).
pytest_plugins = ["fixtures_guard", "fixtures_store", "fixtures_serving", "fixtures_gateway", "fixtures_cli"]
