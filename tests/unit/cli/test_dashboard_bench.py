"""``benchmarks/dashboard.py`` runs at a small size and reports every figure it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_dashboard_benchmark_reports_first_render_and_the_baseline() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "dashboard.py"),
            "--rollouts",
            "1500",
            "--repeats",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])["sqlite"]
    assert set(figures) == {"first_s", "warm_s", "deep_s", "filtered_s", "version_s", "baseline_s"}
    assert 0 < figures["first_s"] < 1.0 and all(v > 0 for v in figures.values())
    assert "filled 1,500 rollouts" in proc.stdout and "first render" in proc.stdout
