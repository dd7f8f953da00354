"""examples/order_desk_baseline.py runs as its docstring says: greedy held-out rollouts of the order bot through
the whole stack (embedded engine here), its printed summary and ``OUT/baseline.json``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from prerequisites import load_data
from processes import run_script

from agentforge.agents.customer_service.order_desk import order_desk_tasks
from agentforge.agents.customer_service.order_eval import PARTS

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow  # the embedded engine loads the default model (~20 s in all)


def test_two_held_out_rollouts_on_the_embedded_engine_write_the_baseline(tmp_path: Path) -> None:
    load_data(order_desk_tasks, None, 2)  # the Bitext and tau-retail sets: skipped (or failed) without them
    out = run_script(
        ROOT / "examples" / "order_desk_baseline.py",
        *("--backend", "embedded", "--eval-size", "2", "--workers", "2", "--out", str(tmp_path)),
        cwd=tmp_path,
    )
    summary = json.loads((tmp_path / "baseline.json").read_text())
    assert summary["n"] == 2 and summary["states"] == {"succeeded": 2}
    assert summary["backend"] == "embedded" and summary["split"] == "test" and summary["temperature"] == 0.0
    assert set(summary["parts"]) == set(PARTS) and all(0.0 <= v <= 1.0 for v in summary["parts"].values())
    assert sum(summary["tools_chosen"].values()) == sum(summary["tools_gold"].values()) == 2
    assert summary["one_trajectory_share"] == 1.0  # each rollout's calls form one trajectory
    assert math.isclose(summary["reward"], sum(summary["scores"]) / 2)
    assert (tmp_path / "traces.db").is_file()
    lines = out.splitlines()
    assert lines[0].startswith("order desk, base policy, 2 rollouts (test split, T=0.0, G=1, embedded, ")
    assert all(f"{p} {summary['parts'][p]:.3f}" in lines[0] for p in PARTS)
    assert lines[1].startswith(f"reward {summary['reward']:.3f}; tools chosen ")
    assert lines[2].startswith("LLM calls per rollout ") and lines[2].endswith("one trajectory 100%")
