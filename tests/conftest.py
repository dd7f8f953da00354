"""Shared pytest configuration. Fixtures live in plugin modules next to this file, one per component."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

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


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under pytest-xdist (``make test`` runs ``-n 2 --dist loadgroup``), every ``vllm`` test joins one group,
    so one worker runs them in turn on the session's single vLLM server (and the engines the lifecycle tests
    start and kill), while the other worker takes the rest: two engines at once would halve each one's 2 cores
    and double the session server's start. Marked as each item is collected, before xdist's
    ``pytest_collection_modifyitems`` reads the group into the node id."""
    if item.get_closest_marker("vllm") is not None and item.config.pluginmanager.hasplugin("xdist"):
        item.add_marker(pytest.mark.xdist_group("vllm"))


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker's torch gets its share of the cores (2 workers on 2 cores: one thread
    each). Two workers' default pools would put 4 OpenMP threads on 2 cores, whose spin-waits burn the time
    the other worker needs: on the trainer tests (``-n 2``) one thread each took 10 % less wall and CPU time.
    Subprocesses a test starts (engines, ``accelerate``, the CLI) keep their thread counts, but every OpenMP
    runtime of the worker and its subprocesses waits passively (``OMP_WAIT_POLICY=PASSIVE``, read when the
    runtime loads): a thread that finished its share sleeps instead of spinning on a core the other worker's
    engine or trainer needs (an embedded-engine job beside a one-thread torch loop: 31 → 26 s)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            import torch
        except ImportError:
            return
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
